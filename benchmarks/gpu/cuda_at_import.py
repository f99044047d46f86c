"""Where SGLang's own modules and the GPU libraries reach CUDA while they are imported (issue 44).

    python benchmarks/gpu/cuda_at_import.py [--json sites.json] [MODULE ...]

The fast start's template preloads only third-party libraries that leave CUDA alone; SGLang's own
modules are left to each child (about 4 s of a forked scheduler's start on the H200), because some
of them ask torch about the GPU at import. Which calls, from where, decides what a template could
answer without initialising CUDA (a compute capability NVML also knows) and what it cannot. This
imports the modules in a fresh interpreter with torch's lazy CUDA initialisation watched, not
fenced (each call goes on to the real driver, so one run sees every site, not only the first):
every call into `torch.cuda._lazy_init`, `torch._C._cuda_init` and the torch.cuda functions listed
in WATCHED is recorded with the torch function called and the first frame outside torch (module,
line, and the module being imported when it ran). Then, in a fresh interpreter per library,
whether importing it after torch alone initialises the driver itself (cuDeviceGetCount answering
anything but CUDA_ERROR_NOT_INITIALIZED), which no Python-level watch sees.

Default modules: what a scheduler and a detokenizer import (SGLang 0.5.11's launch_server, the
two process entry points and the model registry). Standard library, torch and the fast start's own
driver check (python/ on PYTHONPATH, as faststart.sh has it); needs a GPU.
"""

import argparse
import json
import os
import subprocess
import sys
import time

SGLANG = ["sglang.launch_server", "sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager",
          "sglang.srt.models.registry"]  # the registry imports every model module (the scheduler, at load)
GPU_LIBRARIES = ["sgl_kernel", "flashinfer", "xgrammar", "torch_memory_saver", "triton", "deep_gemm",
                 "cuda.bindings.driver", "compressed_tensors", "torchao"]
# torch.cuda functions that answer about a device; each initialises CUDA lazily (the watch records the
# call even where CUDA is initialised already, so a site is seen whether or not it came first)
WATCHED = ["get_device_capability", "get_device_properties", "get_device_name", "current_device",
           "set_device", "mem_get_info", "is_bf16_supported", "get_arch_list", "synchronize",
           "current_stream", "default_stream", "device_count"]
CUDA_ERROR_NOT_INITIALIZED = 3


def _in_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")  # not torchao, torch_memory_saver


def site(label: str) -> dict:
    """The outermost torch function on the way to the watched call (`label` where it was called
    directly) and the first frame outside torch and this watch that called it."""
    frame, inner = sys._getframe(2), None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if _in_torch(module):
            inner = frame
        elif module != __name__:
            break
        frame = frame.f_back
    caller = f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}" if frame is not None else "?"
    api = f"{inner.f_globals.get('__name__')}.{inner.f_code.co_name}" if inner is not None else label
    return {"api": api, "caller": caller}


def watch(torch, calls: list, importing: list) -> None:
    def wrap(holder, name, label):
        real = getattr(holder, name, None)
        if real is None:
            return

        def watched(*args, **kwargs):
            calls.append({**site(label), "watched": label, "importing": importing[-1] if importing else None,
                          "at_s": round(time.monotonic() - T0, 3)})
            return real(*args, **kwargs)
        setattr(holder, name, watched)

    wrap(torch._C, "_cuda_init", "torch._C._cuda_init")
    wrap(torch.cuda, "_lazy_init", "torch.cuda._lazy_init")
    for name in WATCHED:
        wrap(torch.cuda, name, f"torch.cuda.{name}")


def one_library(name: str) -> dict:
    """In a fresh interpreter: torch, then `name`; the driver's state after each."""
    code = ("import json, sys, time; from dflashctl.host.kernel_hook.dflash_faststart import libcuda_state; "
            "import torch; a = libcuda_state(); t = time.monotonic(); import importlib; "
            "importlib.import_module(sys.argv[1]); "
            "print(json.dumps({'after_torch': a, 'after_import': libcuda_state(), "
            "'import_s': round(time.monotonic() - t, 2), 'cuda_initialised_by_torch': torch.cuda.is_initialized()}))")
    r = subprocess.run([sys.executable, "-c", code, name],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:300]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["driver_initialised"] = out["after_import"] not in (None, CUDA_ERROR_NOT_INITIALIZED)
    return out


def summarise(calls: list) -> list:
    """One row per site (the torch function called, from where): how many calls (at least one; each
    passes torch.cuda._lazy_init once, where the torch function takes that way), what they went
    through, whether one reached torch._C._cuda_init (the first initialisation), when first, and
    the module being imported."""
    rows: dict = {}
    for c in calls:
        row = rows.setdefault((c["api"], c["caller"]), {
            "api": c["api"], "caller": c["caller"], "importing": c["importing"], "first_at_s": c["at_s"],
            "calls": 0, "through": []})
        row["calls"] += c["watched"] == "torch.cuda._lazy_init"  # each device query passes it once
        if c["watched"] not in row["through"]:
            row["through"].append(c["watched"])
    for row in rows.values():
        row["calls"] = max(row["calls"], 1)
        row["initialised_cuda"] = "torch._C._cuda_init" in row["through"]
    return sorted(rows.values(), key=lambda r: r["first_at_s"])


T0 = time.monotonic()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", default=SGLANG)
    ap.add_argument("--json", help="write the whole record here")
    a = ap.parse_args()
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as the template has it
    libraries = {name: one_library(name) for name in GPU_LIBRARIES}
    import importlib
    import torch
    calls, importing, imported = [], [], {}
    watch(torch, calls, importing)
    for name in a.modules:
        importing.append(name)
        t = time.monotonic()
        try:
            importlib.import_module(name)
            imported[name] = {"import_s": round(time.monotonic() - t, 2)}
        except Exception as e:  # a diagnostic: say what failed and go on with the next
            imported[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    rows = summarise(calls)
    for name, r in libraries.items():
        print(f"library {name:24} {r}")
    for name, r in imported.items():
        print(f"imported {name:40} {r}")
    print(f"{len(calls)} calls into torch's CUDA initialisation at {len(rows)} sites while importing:")
    for r in rows:
        first = " (the first: it initialised CUDA)" if r["initialised_cuda"] else ""
        print(f"  {r['first_at_s']:7.2f}s  x{r['calls']:<4} {r['api']:40} from {r['caller']} (importing "
              f"{r['importing']}){first}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"libraries": libraries, "imported": imported, "sites": rows, "calls": calls}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
