"""SGLang's memory model, used to decide whether smoke's servers may start side by side on one GPU.

SGLang 0.5.11 sizes a server's KV pool as
    rest = free memory after its weights loaded - (1 - memFractionStatic) x free memory at its init
and stops with "Not enough memory" when rest <= 0. Servers started side by side each take their
init snapshot at a moment smoke does not control. The worst case for server i is that its
snapshot still sees everything free (F) and every other server has allocated all it will ever
hold (U_j) before i measures again: rest_i = f x F - sum_j U_j - W_i - C. (A snapshot taken after
some neighbour allocated loses only f x U_j of the budget instead of U_j: never worse.)
So a start together is race-free when, for every i, f x F >= KV_i + W_i + C + sum_{j != i} U_j,
and sum_i U_i <= F. With --max-total-tokens capping every pool, U_j is small and known.
"""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.host import driver, gpus
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.settings import RunSpec, kv_tokens

SERVER_OVERHEAD_MIB = 4096  # CUDA context, graphs, activations; H200 logs: 2.3-3.2 GiB besides weights and KV


def kv_bytes_per_token(cfg: dict) -> int:
    """K and V of every layer in bf16: SGLang's cell size for an MHA model."""
    return cfg["num_key_value_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"] * 2 * 2


def server_demand_mib(spec: RunSpec, tokens: int) -> dict:
    """What one synthetic server holds at most: weights (file sizes; a dummy load: the target's
    parameter count), KV pool(s) at `tokens`, and the fixed overhead."""
    mib = 1 << 20
    weights = kv = 0
    for path in (spec.target, spec.draft if spec.algorithm else None):
        if path is None:
            continue
        cfg = json.loads((Path(path) / "config.json").read_text())
        st = Path(path) / "model.safetensors"
        if st.exists():
            weights += st.stat().st_size
        else:  # dummy weights: embeddings, lm_head and the layers' projections, bf16
            d, layers, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
            kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
            per_layer = d * (cfg["num_attention_heads"] * cfg["head_dim"]) * 2 + d * kvd * 2 + \
                3 * d * cfg["intermediate_size"]
            weights += 2 * (2 * v * d + layers * per_layer)
        kv += kv_bytes_per_token(cfg) * tokens
    static = (weights + kv) // mib + 1
    return {"run": spec.run, "weights_mib": weights // mib + 1, "kv_mib": kv // mib + 1, "static_mib": static,
            "total_mib": static + SERVER_OVERHEAD_MIB}


def memory_plan(free_mib: int | None, demands: list[dict], fraction: float) -> dict:
    """Whether servers with these demands may start side by side at memFractionStatic `fraction`
    without depending on the order in which they measure the GPU (the rule above). Returns the
    plan: `together` True with the fraction to use (the given one, or the least that fits), or
    False with the reason (then smoke starts them one at a time)."""
    plan = {"rule": "f x free >= static_i + overhead_i + sum of the others' totals, for every server",
            "free_mib": free_mib, "demands": demands, "fraction": fraction}
    if free_mib is None:
        return {**plan, "together": False, "reason": "the GPU's free memory could not be read (NVML)"}
    if len(demands) <= 1:
        return {**plan, "together": True, "needed_fraction": None}
    total = sum(d["total_mib"] for d in demands)
    needed = max((d["static_mib"] + SERVER_OVERHEAD_MIB + total - d["total_mib"]) / free_mib for d in demands)
    plan["needed_fraction"] = round(needed, 4)
    if total > free_mib:
        return {**plan, "together": False,
                "reason": f"the servers hold up to {total} MiB together, {free_mib} MiB are free"}
    if needed <= fraction:
        return {**plan, "together": True}
    chosen = math.ceil(needed * 100) / 100
    if chosen > 0.85:
        return {**plan, "together": False,
                "reason": f"side by side each would need memFractionStatic {needed:.2f} of {free_mib} MiB free"}
    return {**plan, "together": True, "fraction": chosen}


def smoke_gpu(python: str, gpu: int | None, env=os.environ) -> dict | None:
    """NVML's entry (a replayed recording in tests) for the GPU the servers will use: `gpu`
    (--gpu), else the first of CUDA_VISIBLE_DEVICES, else the first listed; None where NVML cannot say."""
    try:
        result = gpus.read(python, env=driver.provide(dict(env))[0])
    except DflashError:
        return None
    facts = result.get("facts") or {}
    listed = facts.get("gpus") or []
    if not result.get("ok") or not listed:
        return None
    index = gpu
    if index is None:
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        index = int(visible) if visible.isdigit() else listed[0].get("index", 0)
    return next((g for g in listed if g.get("index") == index), None)


def free_gpu_mib(python: str, gpu: int | None, env=os.environ) -> int | None:
    """Free memory of the GPU the servers will use."""
    found = smoke_gpu(python, gpu, env)
    return (found.get("memory_mib") or {}).get("free") if found else None


@dataclass(frozen=True)
class Launch:
    """How the servers start: `mode` together or sequential, the memFractionStatic the plan chose
    (None: the flag's or the default), and the plan itself for the result (None: not planned)."""
    mode: str
    fraction: float | None = None
    plan: dict | None = None


def decide_launch(o: SmokeOptions, specs: list[RunSpec], launch: str, synthetic: bool) -> Launch:
    """Servers side by side only where SGLang's memory rule lets every one of them start whatever
    the order in which they measure the GPU (memory_plan); else one at a time."""
    if launch != "together" or not synthetic or len(specs) < 2:
        return Launch(launch)
    fraction = o.mem_fraction_static if o.mem_fraction_static is not None else 0.25
    tokens = {sp.run: kv_tokens(o, sp) for sp in specs}
    if any(t is None for t in tokens.values()):
        lp = {"together": False, "reason": "--max-total-tokens 0: pools are not capped"}
    else:
        demands = [server_demand_mib(sp, tokens[sp.run]) for sp in specs]
        lp = memory_plan(free_gpu_mib(o.python, o.gpu), demands, fraction)
    if lp["together"]:
        say(f"memory: {len(specs)} servers side by side at memFractionStatic {lp['fraction']} "
            f"(each needs at most {lp.get('needed_fraction')} of {lp.get('free_mib')} MiB free, whatever "
            "the order they measure the GPU in)")
        return Launch("together", lp["fraction"] if o.mem_fraction_static is None else None, lp)
    say(f"memory: starting the servers one at a time: {lp['reason']}")
    return Launch("sequential", None, lp)
