"""Every benchmark at least parses, and every GPU script sets the stack up from the tree.

The benchmarks run where tier 1 cannot (a GPU, the network, minutes), so a broken one would only
show on the device: here each shell script passes `bash -n`, each Python benchmark imports (its
`main` not run), and each GPU script sources benchmarks/gpu/common.sh, the one set-up
(benchmarks/README.md), instead of a set-up file outside the tree.
"""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "benchmarks"
SHELL = sorted(BENCH.rglob("*.sh"))
PYTHON = sorted(BENCH.rglob("*.py"))
# Not benchmarks of their own: a wrapper other scripts run, and steps on the local machine.
HELPERS = {"common.sh", "setup.sh", "nix_loader_emulation.sh", "prepare_wrong_xgrammar.sh", "prepare_fixups.sh"}


def test_the_benchmarks_are_found():
    assert len(SHELL) > 20 and len(PYTHON) > 8  # the glob would pass vacuously if the folder moved


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SHELL, ids=lambda p: str(p.relative_to(BENCH)))
def test_shell_benchmark_parses(script):
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: str(p.relative_to(BENCH)))
def test_python_benchmark_imports(script, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # a benchmark may put python/ first
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # __name__ is not "__main__": nothing runs
    assert callable(getattr(module, "main", None)), f"{script.name} has no main() to run"


@pytest.mark.parametrize("script", [p for p in SHELL if p.parent.name == "gpu" and p.name not in HELPERS],
                         ids=lambda p: p.name)
def test_gpu_script_uses_the_common_set_up(script):
    text = script.read_text()
    assert re.search(r"^source .*common\.sh\"?$", text, re.M), f"{script.name} does not source common.sh"
    assert ".gpu/setup.sh" not in text, f"{script.name} names a set-up file outside the tree"
