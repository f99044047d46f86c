"""Each locked wheel's licence, as an SPDX expression read from its metadata (core metadata 2.4's
License-Expression, else a short License field or the License :: classifiers; see license_of).

Wheels whose metadata gives no usable answer get a `LicenseRef-` id: NVIDIA's proprietary wheels
`LicenseRef-NVIDIA-Proprietary`, other proprietary ones `LicenseRef-Proprietary`, the rest
`LicenseRef-Unknown`. nix/lib/license.nix turns the expression into `meta.license`; the two
proprietary ids are unfree there, so nixpkgs refuses them unless the host allows them.

A published wheel never changes, so `dflashctl lock` keeps the licences of files the old lock
already has and reads only new ones; after changing the rules here, move the lock aside and lock
again to re-read them all.
"""

import re
from email.parser import HeaderParser

NVIDIA = "LicenseRef-NVIDIA-Proprietary"
PROPRIETARY = "LicenseRef-Proprietary"
UNKNOWN = "LicenseRef-Unknown"

# Trove classifier (after "License :: ") -> SPDX id. Generic ones ("OSI Approved" alone) are
# left out: they say nothing about which licence.
CLASSIFIERS = {
    "OSI Approved :: MIT License": "MIT",
    "OSI Approved :: MIT No Attribution License (MIT-0)": "MIT-0",
    "OSI Approved :: Apache Software License": "Apache-2.0",
    "OSI Approved :: BSD License": "LicenseRef-BSD",
    "OSI Approved :: ISC License (ISCL)": "ISC",
    "OSI Approved :: Python Software Foundation License": "PSF-2.0",
    "OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "OSI Approved :: The Unlicense (Unlicense)": "Unlicense",
    "OSI Approved :: zlib/libpng License": "Zlib",
    "OSI Approved :: Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "OSI Approved :: Academic Free License (AFL)": "AFL-3.0",
    "OSI Approved :: GNU General Public License v2 (GPLv2)": "GPL-2.0-only",
    "OSI Approved :: GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "OSI Approved :: GNU General Public License v3 (GPLv3)": "GPL-3.0-only",
    "OSI Approved :: GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "OSI Approved :: GNU Lesser General Public License v2 (LGPLv2)": "LGPL-2.0-only",
    "OSI Approved :: GNU Lesser General Public License v2 or later (LGPLv2+)": "LGPL-2.0-or-later",
    "OSI Approved :: GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0-only",
    "OSI Approved :: GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "OSI Approved :: GNU Library or Lesser General Public License (LGPL)": "LicenseRef-LGPL",
    "OSI Approved :: Eclipse Public License 2.0 (EPL-2.0)": "EPL-2.0",
    "Public Domain": "LicenseRef-Public-Domain",
    "CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
    "Other/Proprietary License": PROPRIETARY,
}

# Short License fields people write instead of an SPDX id (compared lower-cased, without
# punctuation runs).
ALIASES = {
    "mit": "MIT", "mit license": "MIT", "the mit license": "MIT",
    "apache 2 0": "Apache-2.0", "apache 2": "Apache-2.0", "apache license 2 0": "Apache-2.0",
    "apache license version 2 0": "Apache-2.0", "apache software license": "Apache-2.0",
    "apache software license 2 0": "Apache-2.0", "asl 2 0": "Apache-2.0",
    "bsd": "LicenseRef-BSD", "bsd license": "LicenseRef-BSD",
    "bsd 3 clause": "BSD-3-Clause", "3 clause bsd": "BSD-3-Clause", "bsd 3": "BSD-3-Clause",
    "new bsd": "BSD-3-Clause", "new bsd license": "BSD-3-Clause", "modified bsd": "BSD-3-Clause",
    "bsd 2 clause": "BSD-2-Clause", "simplified bsd": "BSD-2-Clause",
    "psf": "PSF-2.0", "psf license": "PSF-2.0", "mpl 2 0": "MPL-2.0", "isc": "ISC",
    "isc license": "ISC", "lgpl": "LicenseRef-LGPL", "public domain": "LicenseRef-Public-Domain",
}

_SPDX_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


def _looks_spdx(text: str) -> bool:
    """An SPDX expression: ids joined by AND/OR/WITH (parentheses allowed), nothing else."""
    tokens = text.replace("(", " ").replace(")", " ").split()
    return (len(tokens) % 2 == 1
            and all(_SPDX_TOKEN.fullmatch(t) for t in tokens[::2])
            and all(t in ("AND", "OR", "WITH") for t in tokens[1::2]))


def _alias(short: str) -> str | None:
    key = re.sub(r"[^a-z0-9]+", " ", short.lower()).strip()
    return ALIASES.get(key) or ALIASES.get(key.removesuffix(" license").strip())


def _by_nvidia(headers) -> bool:
    who = " ".join(headers.get_all(k, [""])[0] for k in ("Author", "Author-email", "License"))
    return "nvidia" in who.lower()


def license_of(metadata: str) -> str:
    """The SPDX expression for one wheel's METADATA text (only its headers are read).

    Order: License-Expression; a short License field that names a licence (more precise than
    the generic "BSD License" classifier); the License :: classifiers; proprietary wording; a
    License field that is itself an SPDX expression. NVIDIA's wheels without any of these count
    as NVIDIA-proprietary, everything else as unknown."""
    headers = HeaderParser().parsestr(metadata.split("\n\n", 1)[0] + "\n\n")
    expression = (headers.get("License-Expression") or "").strip()
    if expression:
        return expression
    field = (headers.get("License") or "").strip()
    short = field if len(field) <= 100 and "\n" not in field else ""
    # A whole licence text starts with its title ("MIT License", "BSD 3-Clause License").
    alias = _alias(short or field.split("\n", 1)[0])
    if alias:
        return alias
    ids = []
    for c in headers.get_all("Classifier", []):
        spdx = CLASSIFIERS.get(c.removeprefix("License :: ").strip()) if c.startswith("License :: ") else None
        if spdx and spdx not in ids:
            ids.append(spdx)
    if PROPRIETARY in ids or re.search(r"proprietary|license agreement|\beula\b", short, re.I):
        return NVIDIA if _by_nvidia(headers) else PROPRIETARY
    if ids:
        return " OR ".join(ids)
    if short and _looks_spdx(short):
        return short
    return NVIDIA if _by_nvidia(headers) else UNKNOWN


def is_unfree(expression: str) -> bool:
    """nix/lib/license.nix's rule: any NVIDIA or proprietary id makes the package unfree."""
    ids = re.findall(r"[A-Za-z0-9][A-Za-z0-9.+-]*", expression)
    return any(i.startswith("LicenseRef-NVIDIA") or i == PROPRIETARY for i in ids)


def fetch(urls: dict[str, str], quiet: bool = False) -> dict[str, str]:
    """{file: url} -> {file: licence}, reading each wheel's PEP 658 metadata file in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    from dflashctl.lock.resolver import Ticker
    from dflashctl.lock.wheelfetch import metadata_text

    with Ticker(f"reading the licences of {len(urls)} wheels", quiet), \
            ThreadPoolExecutor(max_workers=16) as pool:
        texts = dict(zip(urls, pool.map(metadata_text, urls.values())))
    return {f: license_of(t) for f, t in sorted(texts.items())}
