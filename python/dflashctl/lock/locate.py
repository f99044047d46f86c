"""Which lock this dflashctl belongs to, wherever it runs from.

The installed package carries the lock its stack was built or exported from, as package data
(`dflashctl/lock/data/python-lock.json`): setup.py copies it into the built package from
$DFLASHCTL_LOCK (the Nix package passes the lock it builds the environment from) or from the
repository's `nix/python-lock.json` (`pip install ./python`). The repository keeps the one copy;
the package's copy exists only in what was built. Run from a source checkout (editable install,
PYTHONPATH=python), the checkout's own lock is used.

Order: `--lock PATH`, then $DFLASHCTL_LOCK, then the packaged lock, then the checkout's.
"""

import os
from dataclasses import dataclass
from pathlib import Path

ENV = "DFLASHCTL_LOCK"
PACKAGED = Path(__file__).resolve().parent / "data" / "python-lock.json"
CHECKOUT = Path(__file__).resolve().parents[3] / "nix" / "python-lock.json"  # python/dflashctl/lock/.


@dataclass(frozen=True)
class FoundLock:
    path: Path | None  # None: no lock anywhere
    source: str  # how it was found, for the report
    searched: tuple[str, ...] = ()


def find(explicit: Path | str | None = None, env: dict[str, str] | None = None) -> FoundLock:
    """The lock to compare this host with; a path given on purpose is returned even if missing
    (the comparison then says it cannot be read)."""
    env = os.environ if env is None else env
    if explicit:
        return FoundLock(Path(explicit), "--lock")
    if env.get(ENV):
        return FoundLock(Path(env[ENV]), f"${ENV}")
    if PACKAGED.is_file():
        return FoundLock(PACKAGED, "installed with dflashctl")
    if CHECKOUT.is_file() and CHECKOUT.with_name("stack.toml").is_file():
        return FoundLock(CHECKOUT, "this dflashctl's source checkout")
    return FoundLock(None, "none", (str(PACKAGED), str(CHECKOUT)))


NOT_FOUND_FIX = (f"pass --lock PATH or set {ENV} to the stack's nix/python-lock.json; or reinstall "
                 "dflashctl from the repository (`pip install ./python`, or the Nix package), which "
                 "carries the lock it belongs to")
