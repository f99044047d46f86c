"""A CUDA_HOME for SGLang's JIT kernels, made of the stack's own CUDA 13.0 wheels.

At its first start SGLang compiles kernels with tvm-ffi and flashinfer: `$CUDA_HOME/bin/nvcc`,
linked with `-L$CUDA_HOME/lib64 -lcudart`. The lock carries nvcc, its headers and libcudart as
wheels (site-packages/nvidia/cu13), laid out with lib/ instead of lib64/ and without the
unversioned libcudart.so; a small tree of symlinks in the cache makes them look like a toolkit.
The stack's toolkit is preferred over a host's nvcc: it is the CUDA line torch was built with.
An explicit CUDA_HOME or CUDA_PATH in the environment always wins.
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from dflashctl import probes


def stack_toolkit(python: str) -> Path | None:
    """site-packages/nvidia/cu13 of the stack's interpreter, if it holds nvcc."""
    r = probes.run_probe(python, "cuda_toolkit", timeout=20.0)
    return Path(r["facts"]["cu13"]) if r["ok"] else None


def toolkit_tree(cu13: Path, cache: Path) -> Path:
    """bin, include, nvvm and lib64/ (with libcudart.so) under `cache`, built once per toolkit."""
    home = cache / f"cuda-home-{hashlib.sha256(str(cu13).encode()).hexdigest()[:12]}"
    if (home / "bin" / "nvcc").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cuda-home-", dir=cache))
    try:
        for sub in ("bin", "include", "nvvm"):
            if (cu13 / sub).exists():
                (tmp / sub).symlink_to(cu13 / sub)
        (tmp / "lib64").mkdir()
        for lib in sorted((cu13 / "lib").iterdir()) if (cu13 / "lib").is_dir() else ():
            (tmp / "lib64" / lib.name).symlink_to(lib)
        if (cu13 / "lib" / "libcudart.so.13").exists():
            (tmp / "lib64" / "libcudart.so").symlink_to(cu13 / "lib" / "libcudart.so.13")
        os.replace(tmp, home)  # atomic; a concurrent start that won the race left the same tree
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (home / "bin" / "nvcc").exists():
            raise
    return home


def provide(env: dict[str, str], python: str) -> dict[str, str]:
    """`env` with CUDA_HOME pointing at the stack's toolkit and the stack's bin/ (ninja) on PATH."""
    env = dict(env)
    bin_dir = os.path.dirname(python)
    if bin_dir:
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
    if env.get("CUDA_HOME") or env.get("CUDA_PATH"):
        return env
    cu13 = stack_toolkit(python)
    if cu13 is None:
        return env  # the host's toolkit, if any; serve's preflight warns when there is none
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    env["CUDA_HOME"] = str(toolkit_tree(cu13, Path(base) / "dflashctl"))
    return env
