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
    try:
        import torch
        major, minor = torch.cuda.get_device_capability()
    except Exception as e:  # no GPU here: nothing will launch a kernel anyway
        return f"no GPU to compare ({type(e).__name__})"
    if f"{major}.{minor}" not in record.get("archs", []):
        return f"built for compute capability {', '.join(record.get('archs', []))}, this GPU is {major}.{minor}"
    return None


def get_jit_cache_dir() -> str:
    aot = os.path.join(os.environ.get("DFLASH_PREBUILT_KERNELS", ""), "flashinfer-aot")
    why = _why_not(aot)
    if why is None:
        return aot
    print(f"[dflash kernels] flashinfer's prebuilt modules not used: {why}", file=sys.stderr, flush=True)
    return os.path.join(aot, "not-used")
