import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


def nix_or_skip() -> str:
    """Path of `nix`; a failure under tests/run (DFLASH_REQUIRE_NIX=1), a skip elsewhere."""
    nix = shutil.which("nix")
    if nix is None:
        if os.environ.get("DFLASH_REQUIRE_NIX") == "1":
            pytest.fail("nix is not on PATH but tests/run requires it")
        pytest.skip("nix is not installed")
    return nix


def nixfmt_or_skip() -> str:
    """nixfmt 1.4.0: $DFLASH_NIXFMT, `nixfmt` on PATH, or ../shared/tools/nixfmt beside the repo
    root (for a git worktree, beside its main checkout too). A failure under tests/run."""
    import subprocess
    candidates = [os.environ.get("DFLASH_NIXFMT"), shutil.which("nixfmt"),
                  REPO.parent / "shared/tools/nixfmt"]
    done = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode == 0:
        candidates.append(Path(done.stdout.strip()).parent.parent / "shared/tools/nixfmt")
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return str(c)
    if os.environ.get("DFLASH_REQUIRE_NIX") == "1":
        pytest.fail("nixfmt is missing: tests/run checks the .nix layout offline with it; put "
                    "nixfmt 1.4.0 on PATH, at ../shared/tools/nixfmt, or name it in DFLASH_NIXFMT")
    pytest.skip("nixfmt is not installed")
