"""Triton's kernels for `dflashctl kernels build`, compiled without a GPU from a recording.

A Triton kernel is compiled for the specialisation its first call has (argument types, which
integers and pointers are multiples of 16, constexpr values), known only at run time. So a GPU host
records them once (DFLASH_TRITON_RECORD, kernel_hook/dflash_triton_cache.py) and the build compiles
each recorded kernel for its target with Triton's own compiler into `<out>/triton`, a Triton cache
directory, together with the C helper modules Triton would build at the first start (cuda_utils and
one launcher per signature). Each kernel's cache key must come out as the one recorded: a kernel
whose source or options differ here (another SGLang, a patched one, another Triton) is stale: it
is reported and left out, and only compiles at the first start as without a recording.

A recording made on one arch also serves another (`carry`): the same kernel with the same
specialisation, compiled for the other target, with the options Triton derives from the target
(the arch, the default imprecise accumulation) recomputed for it. That is the key Triton computes
on such a GPU whenever the specialisation does not depend on the GPU itself; where it does (the
kernels in GPU_BOUND) the kernel is left out, and where a carried kernel's key still differs on
the GPU it is merely never found. A carried kernel is never a wrong one: Triton looks it up under
the key of everything that went into compiling it.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dflashctl import inputs
from dflashctl.errors import CONFIG, FAILED, DflashError
from dflashctl.host import cuda_home
from dflashctl.host.kernel_hook import dflash_kernel_hook as hook

SUBDIR = hook.TRITON_SUBDIR
RECORD_ENV = hook.TRITON_RECORD_ENV
MANAGER = "dflash_triton_cache:PrebuiltFirst"  # kernel_hook/dflash_triton_cache.py, which Triton imports
DATA = Path(__file__).resolve().parent / "data"
SMOKE_RECORDS = "triton-smoke-sm{arch}.jsonl"  # recorded by the default smoke on a GPU of that arch

# SGLang 0.5.11's kernels in the smoke's recording whose specialisation is chosen from the GPU, not
# from the model: another arch's recording says nothing about them (read from its source).
# get_num_kv_splits_triton is not here: it takes the SM count as an i32, specialised only when it
# is 1 or a multiple of 16 (132 on the H200, 148 on a B200, 188 on an RTX PRO 6000: none is).
GPU_BOUND = {
    ("sglang.srt.layers.attention.triton_ops.extend_attention", "_fwd_kernel"):
        "BLOCK_M and BLOCK_N are chosen per compute capability (_get_block_sizes_for_extend_attention: "
        "128x64 on sm90, 64x64 on sm100, 64x128 on sm120 for head_dim <= 128)",
    ("sglang.srt.constrained.triton_ops.bitmask_ops", "apply_token_bitmask_inplace_kernel"):
        "NUM_SMS is a constexpr: the GPU's SM count (132 on the H200)",
}

# python -c CHILD RECORDS_JSON STUB_DIR WITH_CUDA_UTILS: compiles into $TRITON_CACHE_DIR, prints one
# JSON result list; one child of a build also builds cuda_utils (WITH_CUDA_UTILS=1).
CHILD = r'''
import importlib, json, os, sys
records, stub, with_cuda_utils = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3] == "1"
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton.runtime.build import compile_module_from_src
from triton.backends.nvidia import driver as nv

def decode(v):
    if isinstance(v, dict):
        if "dtype" in v: return tl.dtype(v["dtype"])
        if "constexpr" in v: return tl.constexpr(decode(v["constexpr"]))
        if "jit" in v: return resolve(*v["jit"])
        if "tuple" in v: return tuple(decode(x) for x in v["tuple"])
    return v

def tuples(v):
    return tuple(tuples(x) for x in v) if isinstance(v, list) else v

def resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while type(obj).__name__ != "JITFunction" and hasattr(obj, "fn"):
        obj = obj.fn  # autotune / heuristics wrappers
    return obj

def helper(src, name):
    # The module is linked against the driver; loading it needs one, and this build has none.
    try:
        compile_module_from_src(src, name, library_dirs=[nv.libdevice_dir, stub],
                                include_dirs=nv.include_dirs, libraries=nv.libraries)
    except ImportError:
        pass

results = []
if with_cuda_utils:
    try:
        helper(open(os.path.join(nv.dirname, "driver.c")).read(), "cuda_utils")
        results.append({"helper": "cuda_utils", "ok": True})
    except Exception as e:
        results.append({"helper": "cuda_utils", "ok": False, "error": f"{type(e).__name__}: {e}"})
def carried_options(options, source):
    # Triton derives some options from the target (the arch, max_num_imprecise_acc_default, the
    # fp8 types): keep only those the launch chose, as the runtime passes them to parse_options.
    defaults = make_backend(GPUTarget("cuda", source, 32)).parse_options({}).__dict__
    return {k: v for k, v in options.items() if k not in defaults or tuples(v) != defaults[k]}

for r in records:
    out = {"kernel": f"{r['module']}.{r['qualname']}", "hash": r["hash"], "ok": False}
    try:
        fn = resolve(r["module"], r["qualname"])
        if fn.cache_key != r["fn_key"]:
            out.update(stale=True, error="its source differs from the recorded one (another SGLang or Triton)")
            results.append(out); continue
        t = r["target"]
        target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
        recorded = dict(r["signature"])
        signature = {k: tuples(recorded[k]) for k in fn.arg_names}  # the launcher takes them in this order
        constants = {tuple(k): decode(v) for k, v in r["constants"]}
        attrs = {tuple(k): v for k, v in r["attrs"]}
        options = {k: tuples(v) for k, v in r["options"].items()}
        if r.get("carried_from"):
            options = carried_options(options, r["carried_from"]["arch"])
        src = ASTSource(fn, signature, constants, attrs)
        kernel = triton.compile(src, target=target, options=make_backend(target).parse_options(options).__dict__)
        if r.get("carried_from"):
            out.update(hash=kernel.hash, carried=True)  # no GPU of this arch recorded it: Triton's key is the one
        elif kernel.hash != r["hash"]:
            out.update(stale=True, error=f"built under key {kernel.hash[:12]}, recorded {r['hash'][:12]}: "
                       "Triton's options or compiler differ here")
            results.append(out); continue
        by_index = {(fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
        helper(nv.make_launcher(by_index, signature, getattr(kernel.metadata, "tensordesc_meta", None)),
               "__triton_launcher")
        out["ok"] = True
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    results.append(out)
print(json.dumps(results), flush=True)
'''


def read_records(paths: list[Path]) -> list[dict]:
    """The distinct kernels (by cache key) in recording files, in first-seen order."""
    seen: dict[str, dict] = {}
    for path in paths:
        lines = inputs.read_text(path, "Triton recording", "record one with DFLASH_TRITON_RECORD=FILE on a GPU "
                                 "host (docs/smoke.md)", CONFIG, 256 << 20).splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):
                raise DflashError(f"{path} line {n} is not JSON", line[:120],
                                  "record the file again; each line is one kernel", CONFIG) from None
            if isinstance(r, dict) and r.get("format") == hook.TRITON_RECORD_FORMAT:
                if not isinstance(r.get("hash"), str):
                    raise DflashError(f"{path} line {n} is not a kernel record", "it has no cache key (hash)",
                                      "record the file again; each line is one kernel", CONFIG)
                seen.setdefault(r["hash"], r)
    return list(seen.values())


def carry(records: list[dict], arch_version: str) -> tuple[list[dict], list[dict]]:
    """The records of other archs as records for `arch_version` (to be compiled for it), and those
    left out because their specialisation depends on the GPU (GPU_BOUND), each with why."""
    cap = int(arch_version.replace(".", ""))
    carried, left_out = [], []
    for r in records:
        source = r["target"].get("arch")
        if r["target"].get("backend") != "cuda" or source == cap:
            continue
        why = GPU_BOUND.get((r["module"], r["qualname"]))
        if why:
            left_out.append({"kernel": f"{r['module']}.{r['qualname']}", "from": source, "why": why})
            continue
        carried.append({**r, "target": {**r["target"], "arch": cap}, "hash": None,
                        "carried_from": {"arch": source, "hash": r["hash"]}})
    return carried, left_out


def keep_libcuda_cc(scratch: Path, env: dict[str, str]) -> Path:
    """The C compiler Triton runs for its helpers, with --no-as-needed: linked against the empty stub,
    libcuda.so.1 would otherwise be dropped from the module (no symbol of it is used at link time)
    and the module would not load beside the real driver."""
    real = env.get("CC") or shutil.which("gcc", path=env.get("PATH")) or shutil.which("cc", path=env.get("PATH"))
    if not real:
        raise DflashError("no C compiler for Triton's helper modules", "Triton builds them with gcc (or $CC)",
                          "install gcc or set CC", FAILED)
    wrapper = scratch / "cc-keep-libcuda"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" -Wl,--no-as-needed "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def smoke_records(arch_version: str) -> list[Path]:
    path = DATA / SMOKE_RECORDS.format(arch=arch_version.replace(".", ""))
    return [path] if path.exists() else []


def shipped_records() -> list[Path]:
    """The smoke's recordings of every arch shipped (sm90): carried to the others where they can be."""
    return sorted(DATA.glob(SMOKE_RECORDS.format(arch="*")))


def build(python: str, out: Path, arch_version: str, records: list[dict], env: dict[str, str], stub: Path,
          jobs: int | None = None, timeout: float = 1800.0) -> dict:
    """Compile the records whose target is `arch_version` (as `9.0`) into `out`/triton, linking the
    helpers against `stub` (a directory with libcuda.so.1); {"built": [hash], "carried": [hash of
    those carried from another arch], "stale": [result], "failed": [result]}."""
    cap = int(arch_version.replace(".", ""))
    mine = [r for r in records if r["target"].get("backend") == "cuda" and r["target"].get("arch") == cap]
    if not mine:
        return {"built": [], "carried": [], "stale": [], "failed": []}
    child_env = cuda_home.provide(dict(env), python)
    child_env.update({"CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str((out / SUBDIR).resolve())})
    for name in ("TRITON_CACHE_MANAGER", hook.PREBUILT_ENV, RECORD_ENV):
        child_env.pop(name, None)  # Triton's own file cache, written where the layer reads it
    jobs = max(1, min(jobs or os.cpu_count() or 1, 8, (len(mine) + 3) // 4))
    slices = [mine[i::jobs] for i in range(jobs)]
    with tempfile.TemporaryDirectory(prefix="dflash-triton-") as scratch:
        child_env["CC"] = str(keep_libcuda_cc(Path(scratch), env))
        children = []
        for i, part in enumerate(slices):
            f = Path(scratch, f"records-{i}.json")
            f.write_text(json.dumps(part))
            argv = [python, "-c", CHILD, str(f), str(stub), "1" if i == 0 else "0"]
            children.append(subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, stdin=subprocess.DEVNULL))
        results, deadline = [], time.monotonic() + timeout
        for p in children:
            try:
                stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            try:
                results += json.loads(stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise DflashError(f"the Triton build for {arch_version} exited with status {p.returncode}",
                                  "its output ends with:\n" + "\n".join(stderr.strip().splitlines()[-15:]),
                                  f"check that {python} has Triton and SGLang and that a C compiler works",
                                  FAILED) from None
    helpers = [r for r in results if "helper" in r]
    kernels = [r for r in results if "kernel" in r]
    return {"built": sorted({r["hash"] for r in kernels if r["ok"]}),
            "carried": sorted({r["hash"] for r in kernels if r["ok"] and r.get("carried")}),
            "stale": [r for r in kernels if r.get("stale")],
            "failed": [r for r in kernels if not r["ok"] and not r.get("stale")]
            + [r for r in helpers if not r["ok"]]}
