"""`dflashctl export`: one system's lock as a hash-pinned requirements file, for hosts without Nix.

    dflashctl export --system x86_64-linux -o requirements.txt
    python3.12 -m pip install --no-deps --require-hashes -r requirements.txt

Each line is `name==version --hash=sha256:<hex>` with the one wheel the lock chose; pip only
accepts a file with that hash, so every host gets byte-identical wheels.
"""

import argparse
import sys
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.lock import lockfile
from dflashctl.lock.lockfile import Lock
from dflashctl.systems import SYSTEMS


def requirements_text(lock: Lock, system: str) -> str:
    if system not in SYSTEMS:
        raise DflashError(f"unknown system {system!r}", f"known systems: {', '.join(SYSTEMS)}",
                          "pass one of them to --system")
    packages = lock.packages(system)
    lines = [
        f"# dflashctl export --system {system}: {len(packages)} wheels for CPython {lock.python},",
        f"# stack.toml sha256 {lock.spec_sha256}.",
        f"# Install with: python{lock.python} -m pip install --no-deps --require-hashes -r FILE",
    ]
    lines += [f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for _, w in sorted(packages.items())]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    text = requirements_text(lockfile.load(args.lock), args.system)
    if args.output in (None, Path("-")):
        sys.stdout.write(text)
    else:
        lockfile.write_atomic(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="a --require-hashes requirements file for one system",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", required=True, help=f"one of: {', '.join(SYSTEMS)}")
    p.add_argument("--lock", type=Path, default=lockfile.DEFAULT_LOCK, help="default: %(default)s")
    p.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    p.set_defaults(func=run)
