"""Golden tests of nix/lib: each tests/nix/<name>.nix evaluates (builtins only) to the JSON in
tests/nix/expected/<name>.json. After an intended change (a new lock, a new fix-up) rewrite the
goldens with tests/regenerate and read the diff."""

import json
import subprocess

import pytest

from conftest import REPO, nix_or_skip, update_golden
from nixeval import eval_file, eval_json, nix_env

NIX_TESTS = REPO / "tests" / "nix"
EXPECTED = NIX_TESTS / "expected"
CASES = sorted(p.stem for p in NIX_TESTS.glob("*.nix"))

pytestmark = pytest.mark.nix


@pytest.mark.golden
@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    nix = nix_or_skip()
    actual = eval_json(nix, NIX_TESTS / f"{case}.nix")
    golden = EXPECTED / f"{case}.json"
    update_golden(golden, json.dumps(actual, indent=2, sort_keys=True) + "\n")
    assert golden.exists(), f"no golden for {case}; run tests/regenerate and review it"
    assert actual == json.loads(golden.read_text())


def test_every_golden_has_its_expression():
    orphans = sorted(p.stem for p in EXPECTED.glob("*.json") if p.stem not in CASES)
    assert orphans == []


def test_real_lock_is_buildable_as_nix_packages():
    """What the overlay relies on, stated directly rather than only through the golden."""
    result = eval_json(nix_or_skip(), NIX_TESTS / "real-lock.nix")
    assert result["specMatches"], "nix/python-lock.json is stale against nix/stack.toml"
    for system in ("x86_64-linux", "aarch64-linux"):
        s = result[system]
        assert s["missing"] == {} and s["cyclic"] == [] and s["rootsMissing"] == []
        assert s["notRoundTripping"] == []
        assert s["fetchPypi"]["sglang-kernel"]["pname"] == "sglang_kernel"
        assert s["fetchPypi"]["torch"]["version"] == "2.11.0"
        # The dev group is pytest and what only it needs; everything else is the host's stack.
        assert s["devRoots"] == ["pytest"] and s["devMismatch"] == []
        assert set(s["dev"]) == {"pytest", "pluggy", "iniconfig"}
        assert {"nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= set(s["unfree"])
        assert not {"torch", "triton", "sglang", "sglang-kernel"} & set(s["unfree"])


def test_overlay_splits_the_stack_and_maps_licences():
    out = eval_json(nix_or_skip(), NIX_TESTS / "overlay.nix")
    assert "pytest" in out["devStack"] and "pytest" not in out["stack"]
    assert out["envLibs"] == out["stack"] + ["dflashctl"]  # dflash-env: the stack, no dev group
    # The dev shell's Python is the locked stack plus the locked dev group, nothing from nixpkgs.
    assert out["devShellLibs"] == out["devStack"]
    assert out["licenses"]["nvidia-cuda-runtime"] == [{"free": False, "shortName": "CUDA EULA"}]
    assert out["licenses"]["torch"] == [{"shortName": "bsd3"}]
    assert out["licenses"]["build-tagged"] == []  # LicenseRef-Unknown: no meta.license
    assert out["refusedWithoutAllowUnfree"] and out["allowedWithAllowUnfree"] == len(out["stack"])


def test_a_host_that_allows_no_unfree_package_is_told_which():
    done = eval_file(nix_or_skip(), NIX_TESTS / "overlay.nix", "{ config = { }; }")
    assert done.returncode != 0
    assert "1 locked wheels carry a licence nixpkgs counts as unfree" in done.stderr
    assert "nvidia-cuda-runtime" in done.stderr and "allowUnfreePredicate" in done.stderr


def test_nix_and_python_read_the_same_lock():
    """nix/lib/lock.nix and dflashctl.lockfile are the two readers; they must agree."""
    from dflashctl.lock import lockfile

    for path in (REPO / "tests/data/nix/lock.json", REPO / "nix/python-lock.json"):
        expr = f"""let l = import {REPO}/nix/lib; lock = l.lock.read {path}; in
          builtins.mapAttrs (s: _: builtins.mapAttrs (_: p: {{ inherit (p) file sha256 dependencies license dev; }})
            (l.lock.packagesFor lock s)) lock.systems"""
        done = subprocess.run([nix_or_skip(), "eval", "--json", "--impure", "--expr", expr],
                              capture_output=True, text=True, env=nix_env(), timeout=120)
        assert done.returncode == 0, done.stderr
        from_nix = json.loads(done.stdout)
        lock = lockfile.load(path)
        from_python = {
            system: {name: {"file": w.file, "sha256": w.sha256, "dependencies": list(w.dependencies),
                            "license": w.license, "dev": w.dev}
                     for name, w in pkgs.items()}
            for system, pkgs in lock.systems.items()
        }
        assert from_nix == from_python


@pytest.mark.parametrize("expr, message", [
    ('(import {repo}/nix/lib).wheel.fetchPypiArgs {{ file = "torch-2.11.0.tar.gz"; sha256 = ""; }}',
     "is not a wheel file name"),
    ('let l = import {repo}/nix/lib; in l.lock.packagesFor (l.lock.read {repo}/tests/data/nix/lock.json) "riscv64-linux"',
     "the lock has no packages for riscv64-linux (it covers aarch64-linux, x86_64-linux)"),
])
def test_refusals_say_what_and_how_to_fix(expr, message, tmp_path):
    case = tmp_path / "case.nix"
    case.write_text(expr.format(repo=REPO))
    done = eval_file(nix_or_skip(), case)
    assert done.returncode != 0
    assert message in done.stderr
