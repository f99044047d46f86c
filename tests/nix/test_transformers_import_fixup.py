"""The transformers fix-up that keeps torchao out of every server's imports
(overlays/fixups/transformers.nix; issue 44's first import): its install script evaluated by Nix and
run as the build runs it.

Offline: over a module of quantizer_torchao.py's shape built around the fix-up's own texts, with a
stand-in torchao that records its import. With network: over the locked wheel, where the quantizer
no longer imports torchao when it is imported, and its one user of torchao's function imports it."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip
from fixup_shell import locked_wheel, run_script, unpack
from import_fixups import (check_import_moved, HTTP_SERVER, QUANTIZER, before_and_after, imports_at_module_level, parse, run_recording, shaped_sglang_site,
                           shaped_transformers_site as shaped_site, transformers_post_install as post_install)
from nixeval import nix_env

pytestmark = pytest.mark.nix


def import_then_call(site: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Import the (shaped) quantizer, note whether torchao came with it, then call its method."""
    code = ("import sys\n"
            "from transformers.quantizers.quantizer_torchao import TorchAoHfQuantizer\n"
            "print('at import:', 'torchao' in sys.modules)\n"
            "class Model:\n    def state_dict(self):\n        return {'b': 1, 'a': 2}\n"
            "print(TorchAoHfQuantizer().get_state_dict_and_metadata(Model()))")
    return run_recording(code, [site], tmp_path / "torchao-imported", "TORCHAO_IMPORTED")


def test_the_method_imports_torchao_when_called_not_the_module(tmp_path):
    site = shaped_site(tmp_path)
    runs = before_and_after(post_install(), tmp_path / "out", lambda: import_then_call(site, tmp_path))
    check_import_moved(runs, ["{'flattened': ['a', 'b']}"],
                       site / "transformers/quantizers/__pycache__/quantizer_torchao.*.pyc")


def test_a_wheel_without_the_lines_stops_the_build(tmp_path):
    """--replace-fail: a re-lock to a transformers whose quantizer changed fails the build (and
    `dflashctl audit`) instead of leaving torchao's import silently in place."""
    shaped_site(tmp_path)
    assert run_script(post_install(), tmp_path / "out").returncode == 0
    again = run_script(post_install(), tmp_path / "out")
    assert again.returncode != 0 and "not found" in again.stderr


@pytest.mark.network
def test_the_locked_quantizer_no_longer_imports_torchao_when_imported(tmp_path):
    site = unpack(locked_wheel("transformers", tmp_path), tmp_path / "out")

    def torchao_at_import() -> list[str]:
        return [m for m in imports_at_module_level(parse(site / QUANTIZER)) if m.split(".")[0] == "torchao"]

    assert torchao_at_import() == ["torchao.prototype.safetensors.safetensors_support"]
    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert torchao_at_import() == []
    # every use of the function is inside the method that now imports it
    tree = parse(site / QUANTIZER)
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_state_dict_and_metadata")
    inside = {id(n) for n in ast.walk(method)}
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "flatten_tensor_state_dict"]
    assert uses and all(id(n) in inside for n in uses)
    (imported,) = [n for n in method.body if isinstance(n, ast.ImportFrom)]  # after its docstring
    assert imported.module == "torchao.prototype.safetensors.safetensors_support"
    assert [a.name for a in imported.names] == ["flatten_tensor_state_dict"]


def test_the_gpu_benchmarks_make_the_builds_edits(tmp_path):
    """benchmarks/gpu/prepare_fixups.sh writes sglang's and transformers' fix-up scripts as Nix evaluates
    them, and common.sh's stack_fixups makes on the GPU machine's unpacked wheels exactly the edits the build
    makes, keeping each published file beside it (what faststart.sh's imports step alternates)."""
    nix_or_skip()
    built = shaped_site(tmp_path / "built")
    shaped_sglang_site(tmp_path / "built")
    payload = tmp_path / "gpu"
    bench = shaped_site(tmp_path / "bench")
    shaped_sglang_site(tmp_path / "bench")
    published = {p.relative_to(bench): p.read_text() for p in bench.rglob("*.py")}

    made = subprocess.run(["bash", str(REPO / "benchmarks/gpu/prepare_fixups.sh"), str(payload)], cwd=REPO,
                          env=nix_env(), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in payload.iterdir()) == ["sglang-postinstall.sh", "transformers-postinstall.sh"]
    for script in payload.iterdir():
        assert run_script(script.read_text(), tmp_path / "built/out").returncode == 0

    applied = subprocess.run(["bash", "-c", f'source {REPO}/benchmarks/gpu/common.sh && stack_fixups "$1"', "-",
                              str(payload)], env={**nix_env(), "SITE": str(bench), "PY": sys.executable},
                             capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    edited = sorted(Path(p).relative_to(bench) for p in (bench / ".fixups-edited").read_text().split())
    assert [str(p) for p in edited] == ["sglang/__init__.py", HTTP_SERVER, "sglang/utils.py", QUANTIZER]
    for rel in edited:
        assert (bench / rel).read_text() == (built / rel).read_text() != published[rel]
        assert Path(f"{bench / rel}.orig").read_text() == published[rel]
