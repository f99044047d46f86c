"""Preflight: are this instance's GPUs healthy, and is the memory its SGLang will claim free?

One NVML reading (host/gpus.py) answers both. A GPU that is lost, has a row remap pending or failed,
or uncorrected ECC errors since its last reset refuses the start (host/gpu_health.py, exit
PREFLIGHT_GPU_FAULT); its free memory is then beside the point and not judged.

SGLang 0.5.11 sizes its pool for weights and KV cache from the memory free when it starts: free -
(1 - mem_fraction_static) x the GPU's total (service/sglang_0_5_11.pool_mib). Memory another process
holds shrinks that pool, and when it leaves none SGLang fails with "Not enough memory" after the
weights have loaded: refused here, naming the memFractionStatic that would fit. An instance that does
not share its GPUs (allowSharedGpus false) must also find the f x total it was sized for free.
"""

import math

from dflashctl import errors
from dflashctl.host import gpu_health, gpus, probes
from dflashctl.host.gpus import describe_processes, holders, mib_text
from dflashctl.service import sglang_0_5_11
from dflashctl.service.config import InstanceConfig


def instance_gpus(cfg: InstanceConfig, env: dict[str, str]) -> list[int]:
    """NVML indices of the GPUs SGLang will use: `gpus`, else the first tpSize visible ones.

    Assumes CUDA's order is NVML's (PCI bus order; true where all GPUs are the same model).
    """
    if cfg.gpus:
        return list(cfg.gpus)
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible):
        return [int(v) for v in visible[:cfg.tp_size]]
    return list(range(cfg.tp_size))


def claimed_fraction(cfg: InstanceConfig, snapshot: dict, indices: list[int]) -> tuple[float, str]:
    if cfg.mem_fraction_static is not None:
        return cfg.mem_fraction_static, f"memFractionStatic {cfg.mem_fraction_static:g}"
    totals = [g["memory_mib"]["total"] for g in snapshot["gpus"] if g["index"] in indices]
    if not totals:
        return 0.0, "no GPU"
    fraction = sglang_0_5_11.default_mem_fraction(
        min(totals), cfg.tp_size, cfg.speculative.algorithm, cfg.cuda_graph_max_bs,
        piecewise="--disable-piecewise-cuda-graph" not in cfg.extra_args)
    return fraction, f"SGLang's default mem_fraction_static {fraction:g} for this GPU"


def preflight_checks(cfg: InstanceConfig, python: str, child_env: dict[str, str],
                     timeout: float = 20.0) -> list[probes.Check]:
    """serve's GPU step: the health of the instance's GPUs, then (when they are healthy) the claim."""
    result = gpus.read(python, gpus.LIBRARY, timeout, child_env)
    indices = instance_gpus(cfg, child_env)
    health = gpu_health.preflight_check(result, indices)
    if health.status == "fail":
        return [health]
    return [health, claim_check(cfg, result, indices)]


def preflight_check(cfg: InstanceConfig, python: str, child_env: dict[str, str],
                    timeout: float = 20.0, env: dict[str, str] | None = None) -> probes.Check:
    env = child_env if env is None else env  # SGLang's environment: it sees the driver discovery found
    result = gpus.read(python, gpus.LIBRARY, timeout, env)
    return claim_check(cfg, result, instance_gpus(cfg, child_env))


def claim_check(cfg: InstanceConfig, result: dict, indices: list[int]) -> probes.Check:
    if not result.get("ok"):
        return check_claim(result, indices, 0.0, "")
    fraction, how = claimed_fraction(cfg, result["facts"], indices)
    return check_claim(result, indices, fraction, how, shared=cfg.allow_shared_gpus)


# ------------------------------------------------------------------------------- the claim's rules

def fitting_fraction(free_mib: int, total_mib: int) -> float | None:
    """The smallest memFractionStatic (2 decimals) whose pool is positive, or None when none is below 1."""
    f = math.floor((1 - free_mib / total_mib) * 100 + 1) / 100
    return f if f < 1 else None


def _fraction_range(free_mib: int, total_mib: int) -> tuple[float, float] | None:
    """memFractionStatic values meeting both rules of check_claim (None: none does)."""
    lo, hi = fitting_fraction(free_mib, total_mib), math.floor(free_mib / total_mib * 100) / 100
    return (lo, hi) if lo is not None and lo <= hi else None


def check_claim(result: dict, indices: list[int], fraction: float, how: str,
                shared: bool = False) -> probes.Check:
    """Refuse when SGLang would not fit on a GPU of the instance.

    Two rules. SGLang's own (always): its pool, free - (1 - f) x total, must be positive, or it stops
    with "Not enough memory" after loading the weights. Ours, unless the instance shares its GPUs
    (`shared`, allowSharedGpus): the f x total it was sized for must be free, so other work does not
    shrink it.
    """
    name = "gpu-memory"
    if not result.get("ok"):
        return probes.warn(name, f"GPU memory not checked: NVML gave no answers ({probes.failure_text(result)})",
                           "see the driver check", **probes.evidence(result))
    by_index = {g["index"]: g for g in result["facts"]["gpus"]}
    absent = [i for i in indices if i not in by_index]
    if absent:
        return probes.fail(name, f"GPU {', '.join(map(str, absent))} not found: NVML sees "
                           f"{len(by_index)} GPU(s) ({', '.join(map(str, sorted(by_index))) or 'none'})",
                           "list GPUs this host has in gpus (nvidia-smi -L)", errors.CONFIG)
    j = _judge([by_index[i] for i in indices], fraction, how, shared)
    if j["short"]:
        return probes.fail(name, "; ".join(j["short"]), _short_fix(j["fits"], shared)
                           + "; `dflashctl doctor` lists every GPU's processes", errors.PREFLIGHT_GPU_BUSY)
    if j["busy"]:
        return probes.fail(name, "; ".join(j["busy"]), _busy_fix(j["ranges"])
                           + "; `dflashctl doctor` lists every GPU's processes", errors.PREFLIGHT_GPU_BUSY)
    if j["loaded"]:
        return probes.warn(name, "; ".join(j["fine"] + j["loaded"]),
                           "other work shares these GPUs: expect lower throughput; move one of them")
    return probes.ok(name, "; ".join(j["fine"]))


def _judge(gpu_list: list[dict], fraction: float, how: str, shared: bool) -> dict[str, list]:
    """Each GPU under one rule's words: busy (ours), short (SGLang's), fine, and loaded (fine, but
    others compute on it); per failing GPU the smallest fraction SGLang fits with (`fits`) or both
    rules' range (`ranges`)."""
    j: dict[str, list] = {"busy": [], "short": [], "fine": [], "loaded": [], "fits": [], "ranges": []}
    for g in gpu_list:
        i, mem = g["index"], g["memory_mib"]
        need = int(fraction * mem["total"])
        pool = sglang_0_5_11.pool_mib(mem["free"], mem["total"], fraction)
        where = f"GPU {i} ({g['name']}): {mib_text(mem['free'])} free of {mib_text(mem['total'])}"
        if not shared and mem["free"] < need:  # ours first: the words serve printed live on the H200
            j["busy"].append(f"{where}, SGLang claims {mib_text(need)} ({how}); held by {holders(g)}")
            j["ranges"].append(_fraction_range(mem["free"], mem["total"]))
        elif fraction and pool <= 0:
            j["short"].append(f"{where}; SGLang's pool for weights and KV cache would be {mib_text(mem['free'])} "
                              f"free - (1 - {fraction:g}) x {mib_text(mem['total'])} = {pool / 1024:.1f} GiB "
                              f"({how}), so SGLang would stop with \"Not enough memory\"; held by {holders(g)}")
            j["fits"].append(fitting_fraction(mem["free"], mem["total"]) if shared
                             else _fraction_range(mem["free"], mem["total"]))
        else:
            j["fine"].append(f"{where}, SGLang claims {mib_text(need if not shared else min(need, pool))} ({how})")
            util = (g.get("utilization_percent") or {}).get("gpu") or 0
            if util > 0 or g.get("processes"):
                j["loaded"].append(f"GPU {i} is {util} % busy: {describe_processes(g)}")
    return j


def _short_fix(fits: list, shared: bool) -> str:
    """The fix when SGLang's pool would be empty on some GPU."""
    if not all(fits):
        return ("no memFractionStatic fits on this GPU now (SGLang's pool needs a larger one, and "
                + ("any larger one is refused unless f x total is free; set allowSharedGpus to share"
                   if not shared else "none is below 1") + "): stop the processes holding it")
    if shared:
        return (f"set memFractionStatic to at least {max(fits):.2f} plus the weights' share of the GPU "
                "(the pool holds the weights and the KV cache), or free the GPU")
    lo, hi = max(r[0] for r in fits), min(r[1] for r in fits)
    return (f"set memFractionStatic from {lo:.2f} (plus the weights' share of the GPU) to {hi:.2f}"
            if lo <= hi else "free the GPU: no memFractionStatic fits on all of its GPUs")


def _busy_fix(ranges: list) -> str:
    """The fix when other work holds the f x total the instance was sized for."""
    lower = None
    if all(ranges):
        lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
        lower = (f"set memFractionStatic from {lo:.2f} to {hi:.2f} (both rules fit: SGLang's pool, free - "
                 "(1 - f) x total, stays positive and f x total is free)" if lo <= hi else None)
    return ("stop the processes holding it, give the instance free GPUs (gpus), or "
            + (lower or "free it: no memFractionStatic fits next to that work (a lower one "
               "leaves SGLang's pool, free - (1 - f) x total, at or below zero)"))
