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
from dflashctl.host import cuda_home, sglang_0_5_11
from dflashctl.host.kernel_hook import dflash_kernel_hook as hook

SUBDIR = hook.TRITON_SUBDIR
RECORD_ENV = hook.TRITON_RECORD_ENV
MANAGER = "dflash_triton_cache:PrebuiltFirst"  # kernel_hook/dflash_triton_cache.py, which Triton imports
DATA = Path(__file__).resolve().parent / "data"
SMOKE_RECORDS = "triton-smoke-sm{arch}.jsonl"  # recorded by the default smoke on a GPU of that arch

GPU_BOUND = sglang_0_5_11.TRITON_GPU_BOUND  # kernels specialised from the GPU: not carried to another arch

# The child, a real module run as `python -c SOURCE RECORDS_JSON STUB_DIR WITH_CUDA_UTILS` in the stack's
# interpreter (triton_build_child.py says how).
CHILD = Path(__file__).with_name("triton_build_child.py").read_text()


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
