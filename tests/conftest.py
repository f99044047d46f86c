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
