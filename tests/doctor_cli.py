"""`dflashctl doctor` and `dflashctl diff` run as a user runs them, in a child process."""

import os
import subprocess
import sys
from pathlib import Path


def doctor(python: Path, lock: Path, save: Path, *extra: str) -> subprocess.CompletedProcess:
    # Bytecode is written as on any host, so the first run's compiled imports serve the later ones
    # (the variants share the base's site-packages), also where PYTHONDONTWRITEBYTECODE is set.
    # DFLASH_PREBUILT_KERNELS: the dev shell sets it; the goldens say what a host without it sees
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "DFLASH_PREBUILT_KERNELS")}
    return subprocess.run([sys.executable, "-m", "dflashctl", "doctor", "--python", str(python),
                           "--lock", str(lock), "--save", str(save), "--timeout", "180", *extra],
                          capture_output=True, text=True, env=env)


def diff(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflashctl", "diff", str(a), str(b), *extra],
                          capture_output=True, text=True)
