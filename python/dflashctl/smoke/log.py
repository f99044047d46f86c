"""What smoke tells the user on stderr while it works, and the notes it says before a server starts."""

import os
import sys
from pathlib import Path

from dflashctl.host import driver, jit_caches, kernels
from dflashctl.service.child_env import driver_line


def say(msg: str) -> None:
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


def jit_cache_dir(env=os.environ) -> Path:
    """Where the servers' SGLang JIT kernels (sgl_kernel_jit through tvm-ffi) are compiled to: the
    variable build_env gives them (host/jit_caches.py), else tvm-ffi's own rule."""
    env = dict(env)
    return jit_caches.caches(jit_caches.provide(env, jit_caches.root_for(env)))["tvm-ffi"]


def first_start_note(env=os.environ) -> str | None:
    """A line for the user when SGLang has never compiled its JIT kernels here (about 50 s of nvcc
    on an H200, docs/benchmarks.md); None once the cache holds something."""
    cache = jit_cache_dir(env)
    if env.get(kernels.PREBUILT_ENV):
        return (f"SGLang's JIT kernels: prebuilt ones from {env[kernels.PREBUILT_ENV]}; what they lack "
                f"compiles into {cache}")
    try:
        if any(cache.iterdir()):
            return None
    except OSError:
        pass  # no cache directory yet
    return (f"first start on this host: SGLang compiles its JIT kernels with nvcc (about a minute); "
            f"they are kept in {cache} and beside it, so later starts skip it")


def driver_note() -> str:
    """What driver discovery finds, before any server starts (a mismatch stops smoke here); serve's
    line. Smoke's settings name no driverLibraryDir, so each server's child_env finds the same."""
    _, found = driver.provide(dict(os.environ))
    return driver_line(found)
