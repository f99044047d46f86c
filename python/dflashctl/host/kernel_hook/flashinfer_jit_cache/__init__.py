"""Stands in for the flashinfer-jit-cache wheel: flashinfer 0.6.8 loads `<this dir>/<module>/<module>.so`
(its AOT directory) before it compiles anything. The directory is `flashinfer-aot/` in
$DFLASH_PREBUILT_KERNELS, made by `dflashctl kernels build`. flashinfer checks no arch there, and a
GPU missing from the fat binary would fail at its first launch: so the directory is given only
when its record lists this GPU's compute capability and this flashinfer's version; otherwise a
path that does not exist, and flashinfer compiles as it would without prebuilt kernels.
"""
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("flashinfer-python")  # flashinfer requires ours to start with its own
except PackageNotFoundError:
    __version__ = "0"

RECORD = "dflash-prebuilt.json"


def _why_not(aot: str) -> str | None:
    try:
        with open(os.path.join(aot, RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return f"{aot} holds no {RECORD}"
    if record.get("flashinfer") != __version__:
        return f"built for flashinfer {record.get('flashinfer')}, this is {__version__}"
    cap = _capability()
    if cap is None:
        return "this GPU's compute capability could not be read"
    if cap not in record.get("archs", []):
        return f"built for compute capability {', '.join(record.get('archs', []))}, this GPU is {cap}"
    return None


def _capability() -> str | None:
    """The first visible GPU's compute capability, through NVML: no CUDA context is made here
    (flashinfer is imported by processes that never use the GPU)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(first))
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{major}.{minor}"
    except Exception:
        return None


def get_jit_cache_dir() -> str:
    aot = os.path.join(os.environ.get("DFLASH_PREBUILT_KERNELS", ""), "flashinfer-aot")
    why = _why_not(aot)
    if why is None:
        print(f"[dflash kernels] flashinfer's prebuilt modules from {aot}", file=sys.stderr, flush=True)
        return aot
    print(f"[dflash kernels] flashinfer's prebuilt modules not used: {why}", file=sys.stderr, flush=True)
    return os.path.join(aot, "not-used")
