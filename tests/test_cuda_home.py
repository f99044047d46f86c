"""The CUDA_HOME that serve and smoke give SGLang's JIT, built from the stack's own nvcc wheels."""

import os
import sys
from pathlib import Path

from dflashctl import cuda_home
from dflashctl.serve import jit_toolchain_warnings


def stack(tmp_path: Path, with_nvcc: bool = True) -> str:
    """An interpreter whose site-packages holds nvidia/cu13 as the locked wheels lay it out."""
    cu13 = tmp_path / "site" / "nvidia" / "cu13"
    for sub in ("bin", "include", "lib", "nvvm/bin"):
        (cu13 / sub).mkdir(parents=True)
    (cu13 / "include" / "cuda_runtime.h").write_text("/* header */\n")
    (cu13 / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF")
    if with_nvcc:
        (cu13 / "bin" / "nvcc").write_text("#!/bin/sh\necho nvcc\n")
        (cu13 / "bin" / "nvcc").chmod(0o755)
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_stack_toolkit_becomes_a_cuda_home(tmp_path):
    python = stack(tmp_path)
    env = cuda_home.provide({"PATH": "/usr/bin", "HOME": str(tmp_path / "home")}, python)
    home = Path(env["CUDA_HOME"])
    assert home.is_relative_to(tmp_path / "home" / ".cache" / "dflashctl")
    assert os.access(home / "bin" / "nvcc", os.X_OK)
    assert (home / "include" / "cuda_runtime.h").read_text() == "/* header */\n"
    # tvm-ffi links -L$CUDA_HOME/lib64 -lcudart: the unversioned name must resolve
    assert (home / "lib64" / "libcudart.so").resolve() == (tmp_path / "site/nvidia/cu13/lib/libcudart.so.13")
    assert env["PATH"].split(os.pathsep)[0] == str(Path(python).parent)  # the stack's ninja
    assert not any("nvcc (" in w for w in jit_toolchain_warnings(env))  # c++ may still be missing here
    # built once: a second start reuses the same tree
    assert cuda_home.provide({"PATH": "/usr/bin", "HOME": str(tmp_path / "home")}, python)["CUDA_HOME"] == str(home)


def test_explicit_cuda_home_wins(tmp_path):
    env = cuda_home.provide({"PATH": "/usr/bin", "CUDA_HOME": "/opt/cuda-13.0"}, stack(tmp_path))
    assert env["CUDA_HOME"] == "/opt/cuda-13.0"
    assert not (tmp_path / "home").exists()


def test_stack_without_nvcc_leaves_the_host_toolkit(tmp_path):
    env = cuda_home.provide({"PATH": "/usr/bin", "HOME": str(tmp_path / "home")}, stack(tmp_path, with_nvcc=False))
    assert "CUDA_HOME" not in env
