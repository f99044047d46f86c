"""`dflashctl export`: one system's lock as a hash-pinned requirements file, for hosts without Nix.

    dflashctl export --system x86_64-linux -o requirements.txt
    python3.12 -m pip install --no-deps --require-hashes -r requirements.txt

Each line is `name==version --hash=sha256:<hex>` with the one wheel the lock chose; pip only
accepts a file with that hash, so every host gets byte-identical wheels.
"""

import sys
from pathlib import Path

from dflashctl import cli_help, output
from dflashctl.errors import INPUT, USAGE, DflashError
from dflashctl.lock import locate, lockfile
from dflashctl.lock.lockfile import Lock
from dflashctl.systems import SYSTEMS


def requirements_text(lock: Lock, system: str, origin: str = "the lock") -> str:
    if system not in SYSTEMS:
        raise DflashError(f"unknown system {system!r}", f"known systems: {', '.join(SYSTEMS)}",
                          "pass one of them to --system", USAGE)
    packages = lock.packages(system)
    missing = lock.missing_dependencies(system)
    if missing:
        shown = "; ".join(f"{dep} (needed by {len(by)}: {', '.join(by[:3])}{', …' if len(by) > 3 else ''})"
                          for dep, by in sorted(missing.items())[:6])
        raise DflashError(f"{origin} is incomplete for {system}: {len(missing)} package(s) are needed but "
                          "not locked", shown + "; pip would install the rest without them (--no-deps)",
                          "restore the lock from git, or regenerate it with `dflashctl lock` (`dflashctl lock "
                          "--check` shows what differs)", INPUT)
    lines = [
        f"# dflashctl export --system {system}: {len(packages)} wheels for CPython {lock.python},",
        f"# stack.toml sha256 {lock.spec_sha256}.",
        f"# Install with: python{lock.python} -m pip install --no-deps --require-hashes -r FILE",
    ]
    lines += [f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for _, w in sorted(packages.items())]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    out = output.check(args.output, "--output")
    path = args.lock or locate.find().path
    if path is None:
        raise DflashError("no lock to export", "this dflashctl carries none and runs outside a checkout",
                          locate.NOT_FOUND_FIX, INPUT)
    text = requirements_text(lockfile.load(path), args.system, str(path))
    output.write(out, text, "--output")
    if out is not None:
        print(f"wrote {out} ({text.count(chr(10)) - 3} wheels from {path})", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="a --require-hashes requirements file for one system",
                              **cli_help.texts("export", __doc__, full=True))
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS), help=f"one of: {', '.join(SYSTEMS)}")
    p.add_argument("--lock", type=Path, default=None,
                   help=f"the lock to export (default: as doctor finds it: ${locate.ENV}, the lock installed "
                        "with dflashctl, its checkout's nix/python-lock.json)")
    p.add_argument("-o", "--output", help="write here instead of stdout ('-': stdout)")
    p.set_defaults(func=run)
