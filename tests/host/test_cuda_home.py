"""The CUDA_HOME that serve and smoke give SGLang's JIT, built from the stack's own nvcc wheels."""

import os
import sys
from pathlib import Path

from dflashctl.host import cuda_home, probes
from dflashctl.service.preflight import jit_toolchain_warnings


def stack(tmp_path: Path, with_nvcc: bool = True, other_root: Path | None = None) -> str:
    """An interpreter whose site-packages holds nvidia/cu13 as the locked wheels lay it out
    (`other_root`: a second site directory later on the path, as a venv under PYTHONPATH)."""
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
    path = os.pathsep.join(str(p) for p in (tmp_path / "site", other_root) if p)
    python.write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} \"$@\"\n")
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


def test_headers_and_libraries_of_every_root_are_merged(tmp_path):
    """On the H200 the device's venv held cuBLAS (cublasLt.h) and PYTHONPATH held nvcc: flashinfer's
    JIT failed with `cublasLt.h: No such file or directory` until both trees were merged."""
    venv = tmp_path / "venv-site"
    (venv / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (venv / "nvidia" / "cu13" / "lib").mkdir()
    (venv / "nvidia" / "cu13" / "include" / "cublasLt.h").write_text("/* cublas */\n")
    (venv / "nvidia" / "cu13" / "include" / "cuda_runtime.h").write_text("/* older copy */\n")
    (venv / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13").write_bytes(b"\x7fELF")
    home = Path(cuda_home.provide({"PATH": "/usr/bin", "HOME": str(tmp_path / "home")},
                                  stack(tmp_path, other_root=venv))["CUDA_HOME"])
    assert (home / "include" / "cublasLt.h").read_text() == "/* cublas */\n"
    assert (home / "include" / "cuda_runtime.h").read_text() == "/* header */\n"  # nvcc's root first
    assert (home / "lib64" / "libcublasLt.so.13").exists() and (home / "lib64" / "libcudart.so").exists()
    assert (home / "bin" / "nvcc").resolve() == tmp_path / "site/nvidia/cu13/bin/nvcc"


def test_doctor_reports_the_stacks_nvcc(tmp_path):
    python = stack(tmp_path / "with")
    found = probes.check_nvcc(probes.run_probe(python, "cuda_toolkit"))
    assert found.status == "ok" and str(tmp_path / "with/site/nvidia/cu13") in found.summary
    missing = probes.check_nvcc(probes.run_probe(stack(tmp_path / "without", with_nvcc=False), "cuda_toolkit"))
    assert missing.status == "warn" and "cuda-toolkit[nvcc" in missing.fix
