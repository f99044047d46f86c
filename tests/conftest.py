import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Fixtures more than one test module uses, in support modules named for what they hold (a test module
# never imports another): pytest finds them here for every test under tests/.
# leak_check first: it marks the environment every process of the session inherits.
pytest_plugins = ["leak_check", "serve_fixture", "h200_recordings", "smoke_runner"]


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
    """A nixfmt from $DFLASH_NIXFMT or PATH; none is a skip, also under tests/run: nixfmt is not on
    the registries these machines reach, and tier 2's checks.formatting is the final word."""
    for c in (os.environ.get("DFLASH_NIXFMT"), shutil.which("nixfmt")):
        if c and os.access(c, os.X_OK):
            return str(c)
    pytest.skip("skipped: no nixfmt (neither $DFLASH_NIXFMT nor nixfmt on PATH); the layout is "
                "checked by checks.formatting in tier 2 (nix flake check)")

def prometheus_or_skip() -> Path:
    """The directory holding `prometheus` and `promtool` (Debian's package: tests/run unpacks it into
    $DFLASH_PROMETHEUS_DIR, or they are on PATH); a failure under tests/run
    (DFLASH_REQUIRE_PROMETHEUS=1), a skip elsewhere."""
    where = os.environ.get("DFLASH_PROMETHEUS_DIR")
    for d in ([Path(where) / "usr" / "bin"] if where else []) + \
            ([Path(shutil.which("promtool")).parent] if shutil.which("promtool") else []):
        if (d / "prometheus").is_file() and (d / "promtool").is_file():
            return d
    if os.environ.get("DFLASH_REQUIRE_PROMETHEUS") == "1":
        pytest.fail("prometheus and promtool are missing but tests/run requires them (it unpacks Debian's "
                    f"prometheus package into $DFLASH_PROMETHEUS_DIR={where}; see its output)")
    pytest.skip("prometheus/promtool not found: run tests/run (it unpacks Debian's package), or put them on PATH")


def jemalloc_or_skip() -> Path:
    """Debian's libjemalloc.so.2 ($DFLASH_JEMALLOC: tests/run unpacks libjemalloc2 into the test
    cache; or the system's); a failure under tests/run (DFLASH_REQUIRE_JEMALLOC=1), a skip elsewhere."""
    for c in (os.environ.get("DFLASH_JEMALLOC"), "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
              "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"):
        if c and Path(c).is_file():
            return Path(c)
    if os.environ.get("DFLASH_REQUIRE_JEMALLOC") == "1":
        pytest.fail("libjemalloc.so.2 is missing but tests/run requires it (it unpacks Debian's libjemalloc2 "
                    "and sets $DFLASH_JEMALLOC; see its output)")
    pytest.skip("no libjemalloc.so.2: run tests/run (it unpacks Debian's libjemalloc2), or set $DFLASH_JEMALLOC")


def update_golden(path: Path, text: str) -> None:
    """DFLASH_UPDATE_GOLDEN=1 writes `text` to the golden `path`; a golden that changed skips its
    test, saying so, so that an update run never reports a pass. Refused where CI is set: a golden
    is rewritten on a developer's machine and its diff reviewed, never made to agree in CI."""
    if os.environ.get("DFLASH_UPDATE_GOLDEN") != "1":
        return
    if os.environ.get("CI"):
        pytest.fail("DFLASH_UPDATE_GOLDEN=1 with CI set: goldens are rewritten on a developer's machine "
                    "(and the diff reviewed), never in CI")
    changed = not path.exists() or path.read_text() != text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if changed:
        pytest.skip(f"rewrote the golden {path}: review the diff (git diff), then run the tests again")
