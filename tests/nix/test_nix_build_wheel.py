"""overlays/build-wheel.nix and the sglang fix-up, evaluated over stand-ins for nixpkgs
(tests/nix/build-wheel.nix): the arguments every wheel hands to buildPythonPackage, and the
fix-up shell code run under bash the way stdenv's fixupPhase runs it."""

import json
import os
import subprocess

import pytest

from conftest import REPO, nix_or_skip
from nixeval import eval_json

pytestmark = pytest.mark.nix


@pytest.fixture(scope="module")
def built():
    return eval_json(nix_or_skip(), REPO / "tests/nix/build-wheel.nix")


def wheels(built):
    s = built["sglang"]
    return {"torch": built["torch"], "sglang": s["locked"], "sglang wheel file": s["wheelFile"],
            "sglang fetched wheel": s["fetchedWheel"]}


def test_a_wheel_gets_no_dist_output(built):
    """`format = "wheel"` adds pythonOutputDistHook (a `dist` output holding the wheel again);
    the wheel's own unpack and install hooks without it keep one copy."""
    for name, args in wheels(built).items():
        assert args["format"] is None and args["pyproject"] is False, name
        assert args["nativeBuildInputs"][:2] == ["wheelUnpackHook", "pypaInstallHook"], name


def test_origin_runpath_is_restored_after_autopatchelf_and_before_import_checks(built, tmp_path):
    """preFixup registers the $ORIGIN step as the last postFixup hook: stdenv runs postFixupHooks
    in order (autoPatchelf and autoAddDriverRunpath registered theirs when sourced), and
    pythonImportsCheck, a preDistPhase, runs after the whole fixupPhase."""
    args = built["torch"]
    assert args["postPhases"] is None  # a postPhase would run after the import checks
    out = tmp_path / "out"
    (out / "lib").mkdir(parents=True)
    for f in ("lib/libtorch.so", "lib/libnccl.so.2", "lib/__init__.py"):
        (out / f).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "patchelf").write_text('#!/bin/sh\necho "patchelf $*" >> "$LOG"\n')
    (bin_dir / "patchelf").chmod(0o755)
    script = f"""
      set -eu
      autoPatchelfPostFixup() {{ echo autoPatchelf >> "$LOG"; }}
      autoFixElfFiles() {{ echo "$1" >> "$LOG"; }}
      addAutoPatchelfSearchPath() {{ echo "search $1" >> "$LOG"; }}
      postFixupHooks=(autoPatchelfPostFixup "autoFixElfFiles addDriverRunpath")
      {args["preFixup"]}
      for hook in "${{postFixupHooks[@]}}"; do eval "$hook"; done
    """
    log = tmp_path / "log"
    env = {**os.environ, "LOG": str(log), "out": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[:2] == ["autoPatchelf", "addDriverRunpath"]
    assert sorted(lines[2:]) == [f"patchelf --add-rpath $ORIGIN {out}/lib/libnccl.so.2",
                                 f"patchelf --add-rpath $ORIGIN {out}/lib/libtorch.so"]


def test_sglang_src_wheel_file_and_fetched_wheel(built):
    s = built["sglang"]
    assert s["locked"]["version"] == "0.4.2" and s["locked"]["src"] == "fetchPypi sglang_kernel-0.4.2"
    assert s["wheelFile"]["version"] == "0.5.12.dev1"
    assert s["wheelFile"]["src"] == "sglang-0.5.12.dev1-cp312-cp312-manylinux_2_34_x86_64.whl"
    # A fetched wheel's store path starts with a hash; the version comes from its name.
    assert s["fetchedWheel"]["version"] == "0.5.12"


def test_sglang_src_source_tree_builds_its_python_directory(built):
    """A checkout is built with its own pyproject (PEP 517) from python/, not copied as a wheel
    (tests/data/nix/sglang-tree: 0.5.11's shape; tests/nix/test_sglang_tree.py runs the build)."""
    tree = built["sglang"]["sourceTree"]
    assert tree["src"] == "sglang-tree" and tree["pyproject"] is True and tree["format"] is None
    # a dynamic version (setuptools-scm) is the lock's, and setuptools-scm is told it
    assert tree["version"] == built["sglang"]["locked"]["version"] == "0.4.2"
    assert tree["env"] == {"SETUPTOOLS_SCM_PRETEND_VERSION": "0.4.2"}
    # the build requirements the tree names: the lock's setuptools, nixpkgs' for the others
    assert tree["build-system"] == ["locked setuptools", "setuptools-scm", "setuptools-rust", "wheel"]
    assert tree["pythonRelaxDeps"] is True  # the versions are the lock's (nix/stack.toml)
    assert "wheelUnpackHook" not in tree["nativeBuildInputs"]
    assert "pypaInstallHook" not in tree["nativeBuildInputs"]  # pyproject = true brings its own
    script = f'sourceRoot=sglang-tree\n{tree["postUnpack"]}\necho "$sourceRoot"'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout == "sglang-tree/python\n"


def test_a_static_version_and_no_rust_extension(tmp_path):
    """nix/lib/pyproject.nix: a [project] version is used as it is; PEP 518's default build
    requirements when the table is absent; no setuptools-rust table, no extension to leave out."""
    from nixeval import nix_env
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.12.dev1"\n')
    lib = REPO / "nix" / "lib" / "pyproject.nix"
    done = subprocess.run([nix_or_skip(), "eval", "--json", "--impure", "--expr",
                           f"(import {lib}).read {tmp_path / 'pyproject.toml'}"], capture_output=True,
                          text=True, env=nix_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": "0.5.12.dev1", "buildSystem": ["setuptools", "wheel"],
                                       "rustExtensions": []}
