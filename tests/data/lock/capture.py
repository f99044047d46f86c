"""Re-capture the offline fixtures from the live index (run by hand, rarely):

    python tests/data/lock/capture.py

Writes uv.lock (every URL replaced by its bare file name, the index replaced by "index", so the
fixture names no host), torch-requires.json (torch's Requires-Dist per system) and metadata.json
(the licence headers of every chosen wheel's METADATA, which lock/licenses.py reads).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from email.parser import HeaderParser
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "python"))

from dflashctl.lock import resolver  # noqa: E402
from dflashctl.lock.wheelfetch import metadata_text  # noqa: E402
from dflashctl.lock import spec as specmod  # noqa: E402
from dflashctl.lock.closure import closure  # noqa: E402

LICENCE_HEADERS = ("License-Expression", "License", "Author", "Author-email")


def sanitise(text: str) -> str:
    text = re.sub(r'url = "[^"]*/([^"/]+)"', r'url = "\1"', text)
    return re.sub(r'registry = "[^"]*"', 'registry = "index"', text)


def licence_headers(text: str) -> dict[str, list[str]]:
    h = HeaderParser().parsestr(text.split("\n\n", 1)[0] + "\n\n")
    out = {k: h.get_all(k) for k in LICENCE_HEADERS if h.get_all(k)}
    out["Classifier"] = [c for c in h.get_all("Classifier", []) if c.startswith("License ::")]
    return out


def main() -> None:
    spec = specmod.load(HERE / "stack.toml")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "pyproject.toml").write_text(resolver.project_toml(spec))
        subprocess.run([resolver.uv_binary(), "lock", "--python", sys.executable, "--directory", tmp],
                       check=True, env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
        raw = Path(tmp, "uv.lock").read_text()
    uv_lock = tomllib.loads(raw)
    closures = {s: closure(uv_lock, spec, s) for s in spec.systems}
    requires = {s: resolver.requires_dist(c.urls["torch"]) for s, c in closures.items()}
    urls = {c.packages[n].file: u for c in closures.values() for n, u in c.urls.items()}
    metadata = {f: licence_headers(metadata_text(u)) for f, u in sorted(urls.items())}
    text = sanitise(raw)
    assert "://" not in text, "a URL survived sanitising"
    (HERE / "uv.lock").write_text(text)
    (HERE / "torch-requires.json").write_text(json.dumps(requires, indent=2, sort_keys=True) + "\n")
    (HERE / "metadata.json").write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    print(f"wrote {HERE / 'uv.lock'}, torch-requires.json and metadata.json")


if __name__ == "__main__":
    main()
