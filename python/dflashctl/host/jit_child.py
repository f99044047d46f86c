"""The child that calls SGLang's JIT module loaders, run inside the stack's interpreter.

Its parents run this file's text with `python -c SOURCE MODE CALLS_JSON [ARCH]` (like
probe_child.py), so it uses the standard library, torch and SGLang only:

- `build CALLS ARCH` (host/kernels.py, `dflashctl kernels build`): no GPU visible, every module
  compiled for ARCH (`9.0`) under SGLang's `override_jit_cuda_arch`;
- `prewarm CALLS` (smoke/jit_prewarm.py): beside the smoke's servers, for the visible GPU, so
  their first CUDA-graph capture finds the modules built.

Each call is [module, loader, args] (host/kernels.calls_for); args named `torch.X` are torch's
dtypes. Every loader is imported first, then all are called at once on threads (nvcc runs as a
subprocess). One JSON line on stdout: {"imports_s": S, "calls": [{"call", "ok", "seconds",
"error"?}]}. A loader that fails is a result, not an exception.
"""

import contextlib
import importlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

NOT_BUILT = "SGLang could not build it (its log says why)"


def torch_values():
    """`torch.bfloat16` -> the dtype; without torch (the tests' stand-in loaders) names stay names."""
    try:
        import torch
    except ImportError:
        return lambda a: a
    return lambda a: getattr(torch, a[6:]) if isinstance(a, str) and a.startswith("torch.") else a


def arch_context(mode, arch):
    """Build: SGLang's override for ARCH. Prewarm: the visible GPU's arch preset, since load_jit sets
    and removes TVM_FFI_CUDA_ARCH_LIST around each build; preset to the same value it stays set for
    every thread, so no build sees it missing."""
    if mode == "build":
        major, minor = (int(x) for x in arch.split("."))
        os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch  # SGLang sets the same value around each build
        try:
            from sglang.jit_kernel.utils import override_jit_cuda_arch
            return override_jit_cuda_arch(major, minor)
        except ImportError:
            return contextlib.nullcontext()
    try:
        from sglang.jit_kernel.utils import get_jit_cuda_arch
        os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", get_jit_cuda_arch().target_name)
    except ImportError:
        pass
    return contextlib.nullcontext()


def import_loaders(calls):
    loaders = []
    for module, function, _ in calls:
        try:
            loaders.append(getattr(importlib.import_module(module), function))
        except Exception as e:  # noqa: BLE001 - reported with the call
            loaders.append(e)
    return loaders


def call_one(call, loader, value):
    if isinstance(loader, Exception):
        return {"call": call, "ok": False, "error": f"{type(loader).__name__}: {loader}", "seconds": 0.0}
    start = time.monotonic()
    try:
        built = loader(*[value(a) for a in call[2]])
    except Exception as e:  # noqa: BLE001 - reported with the call
        return {"call": call, "ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                "seconds": round(time.monotonic() - start, 2)}
    ok = built is not False  # the can_use_* loaders log SGLang's reason and answer False
    return {"call": call, "ok": ok, "seconds": round(time.monotonic() - start, 2),
            **({} if ok else {"error": NOT_BUILT})}


def main():
    mode, calls = sys.argv[1], json.loads(sys.argv[2])
    arch = sys.argv[3] if len(sys.argv) > 3 else None
    value = torch_values()
    started = time.monotonic()
    with arch_context(mode, arch):
        loaders = import_loaders(calls)
        imported = time.monotonic() - started
        with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
            results = list(pool.map(call_one, calls, loaders, [value] * len(calls)))
    print(json.dumps({"imports_s": round(imported, 2), "calls": results}), flush=True)


if __name__ == "__main__":
    main()
