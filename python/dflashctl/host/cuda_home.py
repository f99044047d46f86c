"""A CUDA_HOME for SGLang's JIT kernels, made of the stack's own CUDA 13.0 wheels.

At its first start SGLang compiles kernels with tvm-ffi and flashinfer: `$CUDA_HOME/bin/nvcc`,
linked with `-L$CUDA_HOME/lib64 -lcudart`. The lock carries nvcc, its headers and libcudart as
wheels (site-packages/nvidia/cu13), laid out with lib/ instead of lib64/ and without the
unversioned libcudart.so, and their headers may sit in several roots (cuBLAS's in one venv, nvcc's on
PYTHONPATH); a small tree of symlinks in the cache makes them look like one toolkit.
The stack's toolkit is preferred over a host's nvcc: it is the CUDA line torch was built with.
An explicit CUDA_HOME or CUDA_PATH in the environment always wins.
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from dflashctl.host import probes


def stack_toolkit(python: str) -> list[Path]:
    """site-packages/nvidia/cu13 trees of the stack's interpreter, the one with nvcc first;
    empty when none holds nvcc."""
    r = probes.run_probe(python, "cuda_toolkit", timeout=20.0)
    if not r["ok"]:
        return []
    nvcc_root = Path(r["facts"]["cu13"])
    return [nvcc_root] + [Path(p) for p in r["facts"].get("cu13_roots", []) if Path(p) != nvcc_root]


def _merge(sources: list[Path], dest: Path) -> None:
    """`dest` as a directory of symlinks to the entries of every source (the first one wins)."""
    dest.mkdir()
    for src in sources:
        for entry in sorted(src.iterdir()) if src.is_dir() else ():
            if not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)


def toolkit_tree(roots: list[Path], cache: Path) -> Path:
    """bin and nvvm of roots[0]; include and lib64/ (with libcudart.so) merged over all roots;
    under `cache`, built once per set of roots."""
    key = hashlib.sha256("\0".join(map(str, roots)).encode()).hexdigest()[:12]
    home = cache / f"cuda-home-{key}"
    if (home / "bin" / "nvcc").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cuda-home-", dir=cache))
    try:
        for sub in ("bin", "nvvm"):
            if (roots[0] / sub).exists():
                (tmp / sub).symlink_to(roots[0] / sub)
        _merge([r / "include" for r in roots], tmp / "include")
        _merge([r / "lib" for r in roots], tmp / "lib64")
        cudart = tmp / "lib64" / "libcudart.so.13"
        if cudart.exists() and not (tmp / "lib64" / "libcudart.so").exists():
            (tmp / "lib64" / "libcudart.so").symlink_to(cudart.resolve())
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
    roots = stack_toolkit(python)
    if not roots:
        return env  # the host's toolkit, if any; serve's preflight warns when there is none
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    env["CUDA_HOME"] = str(toolkit_tree(roots, Path(base) / "dflashctl"))
    return env
