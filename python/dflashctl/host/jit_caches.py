"""Where SGLang's stack keeps what it compiles: every JIT cache named explicitly, under one root.

Left to their defaults, the caches land in places a systemd unit loses or cannot write: tvm-ffi
in ~/.cache/tvm-ffi, flashinfer in ~/.cache/flashinfer, Triton in ~/.triton/cache, CUDA's
ComputeCache in ~/.nv, torch inductor in /tmp/torchinductor_$USER and CuTe-DSL (flashinfer's RMSNorm
when nvidia-cutlass-dsl is installed) in /tmp/$USER/cutlass_python_cache. The unit's PrivateTmp
empties /tmp at every restart, so the last two were compiled again at every start. Here each one
gets its own variable pointing under the instance's cache directory, which systemd keeps.

A value already in the environment (the instance's `environment` setting, a test's own cache)
wins. A cache directory inside /nix/store is refused: the store is read-only, and tvm-ffi waits
forever on a lock file it cannot create there.
"""

import os
from pathlib import Path

from dflashctl.errors import CONFIG, DflashError

# variable -> directory under the root (FLASHINFER_WORKSPACE_BASE: flashinfer adds .cache/flashinfer)
CACHES = {
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUTE_DSL_CACHE_DIR": "cute-dsl",
    "TRITON_CACHE_DIR": "triton",
    "CUDA_CACHE_PATH": "cuda-compute-cache",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
}
STORE = "/nix/store/"


def root_for(env: dict[str, str], model_cache: str | None = None) -> Path | None:
    """The JIT caches' root: `jit/` in the unit's own cache directory (the first entry of
    $CACHE_DIRECTORY that is not the model cache, which may be shared by several instances), else
    `dflashctl/jit` in $XDG_CACHE_HOME or $HOME/.cache; None when the environment names none."""
    own = [d for d in env.get("CACHE_DIRECTORY", "").split(":") if d and d != model_cache]
    if own:
        return Path(own[0]) / "jit"
    base = env.get("XDG_CACHE_HOME") or (os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    return Path(base) / "dflashctl" / "jit" if base else None


def provide(env: dict[str, str], root: Path | None) -> dict[str, str]:
    """`env` with every JIT cache variable set under `root` (values already set are kept)."""
    env = dict(env)
    if root is not None:
        for var, sub in CACHES.items():
            env.setdefault(var, str(root / sub))
    check(env)
    return env


def check(env: dict[str, str]) -> None:
    """Refuse a JIT cache in the read-only store (tvm-ffi would hang on its lock file)."""
    for var in CACHES:
        value = env.get(var)
        if value and os.path.realpath(value).startswith(STORE):
            raise DflashError(f"{var}={value} is in the Nix store, which is read-only",
                              "SGLang's JIT writes there and tvm-ffi waits forever for a lock file it "
                              "cannot create",
                              f"remove {var} from the instance's environment (it then lives in the "
                              "instance's cache directory); prebuilt kernels from the store are given "
                              "with DFLASH_PREBUILT_KERNELS instead", CONFIG)


def same_dir(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def caches(env: dict[str, str]) -> dict[str, Path]:
    """Each cache's directory as the tools will find it in `env` (their own defaults otherwise)."""
    home = env.get("HOME") or os.path.expanduser("~")
    user = env.get("USER") or env.get("LOGNAME") or "root"
    return {
        "tvm-ffi": Path(env.get("TVM_FFI_CACHE_DIR") or os.path.join(home, ".cache", "tvm-ffi")),
        "flashinfer": Path(env.get("FLASHINFER_WORKSPACE_BASE") or home) / ".cache" / "flashinfer",
        "cute-dsl": Path(env.get("CUTE_DSL_CACHE_DIR") or f"/tmp/{user}/cutlass_python_cache"),
        "triton": Path(env.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")),
        "cuda": Path(env.get("CUDA_CACHE_PATH") or os.path.join(home, ".nv", "ComputeCache")),
        "torchinductor": Path(env.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{user}"),
    }
