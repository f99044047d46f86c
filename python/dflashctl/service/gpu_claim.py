"""Preflight: are this instance's GPUs healthy, and is the memory its SGLang will claim free?

One NVML reading (host/gpus.py) answers both. A GPU that is lost, has a row remap pending or failed,
or uncorrected ECC errors since its last reset refuses the start (host/gpu_health.py, exit
PREFLIGHT_GPU_FAULT); its free memory is then beside the point and not judged.

SGLang 0.5.11 sizes its pool for weights and KV cache from the memory free when it starts: free -
(1 - mem_fraction_static) x the GPU's total (host/gpus.sglang_pool_mib). Memory another process
holds shrinks that pool, and when it leaves none SGLang fails with "Not enough memory" after the
weights have loaded: refused here, naming the memFractionStatic that would fit. An instance that does
not share its GPUs (allowSharedGpus false) must also find the f x total it was sized for free.
"""


from dflashctl.host import gpu_health, gpus, probes
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
    fraction = gpus.sglang_default_mem_fraction(
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
        return gpus.check_claim(result, indices, 0.0, "")
    fraction, how = claimed_fraction(cfg, result["facts"], indices)
    return gpus.check_claim(result, indices, fraction, how, shared=cfg.allow_shared_gpus)
