"""Build hook: the built package carries the stack's lock (dflashctl/lock/locate.py reads it).

The lock comes from $DFLASHCTL_LOCK (the Nix package sets it to the lock it builds the stack from)
or from ../nix/python-lock.json next to this directory (`pip install ./python` in the repository).
It is copied into the build only, never into the source tree: the repository keeps one copy.
Everything else about the package is in pyproject.toml.
"""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REPO_LOCK = Path(__file__).resolve().parent.parent / "nix" / "python-lock.json"
PACKAGED = Path("dflashctl", "lock", "data", "python-lock.json")


class BuildWithLock(build_py):
    def run(self):
        super().run()
        given = os.environ.get("DFLASHCTL_LOCK")
        source = Path(given) if given else REPO_LOCK
        if given and not source.is_file():
            raise SystemExit(f"DFLASHCTL_LOCK={given}: no such file (the lock to package with dflashctl)")
        if source.is_file():
            target = Path(self.build_lib) / PACKAGED
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        else:  # a build outside the repository: doctor then says plainly that it has no lock
            print(f"dflashctl: no lock at {source}; the package will not carry one")


setup(cmdclass={"build_py": BuildWithLock})
