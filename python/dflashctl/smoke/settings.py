"""The settings policy: each server smoke starts becomes an instance JSON, the keys the NixOS module
writes, as `dflashctl serve --config` would read it (then config -> sglang_args -> child_env ->
server.Server, fleet.py). The synthetic pairs get smoke's defaults (small KV pools, triton
attention, no piecewise graphs); --model gets SGLang's own unless a flag says otherwise.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.service import config, model_check, sglang_args
from dflashctl.smoke import sweep, synthetic
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions

DEFAULT_SYNTHETIC_KV_TOKENS = 65536  # 1 GiB for the random target; smoke needs ~2.5k tokens
ORACLE_KV_TOKENS = 32768  # 1 GiB at the oracle target's 16 KV heads; smoke needs ~2.5k tokens


@dataclass(frozen=True)
class RunSpec:
    """One server smoke starts: which run, which weights, how they load."""
    run: str  # "baseline", "DFLASH", "DFLASH-poisoned", "DDTREE", "grammar"
    algorithm: str | None  # --speculative-algorithm, None for plain decoding
    target: str
    draft: str | None = None
    dummy: bool = False  # SGLang gives random weights from config.json (--load-format dummy)
    tokenizer: bool = True  # False: --skip-tokenizer-init, token ids in and out, no grammar backend
    synthetic: bool = True  # a pair written here (smoke's defaults apply) or --model's
    kv_tokens: int | None = None  # --max-total-tokens for this server (None: the smoke-wide choice)
    cuda_graphs: bool = True  # False for a server that is not timed (the grammar server): ready sooner


def instance_settings(o: SmokeOptions, spec: RunSpec, port: int, launch: str, fraction: float | None = None) -> dict:
    """The instance JSON for one run; `fraction`: the memory fraction the launch plan chose
    (memory.decide_launch), else the flag's or the default."""
    d: dict = {"name": f"smoke-{spec.run.lower()}", "model": spec.target, "host": "127.0.0.1", "port": port,
               "allowSharedGpus": True, "startTimeoutSec": int(o.start_timeout),
               # smoke's figures are measured as they always were, without SGLang's metrics (what the
               # service's default costs is benchmarks/gpu/metrics_cost.sh's measurement)
               "enableMetrics": False, "fastStart": o.fast_start}
    mem = o.mem_fraction_static if o.mem_fraction_static is not None else fraction
    if mem is None and spec.synthetic:
        mem = 0.25 if launch == "together" else 0.5
    if mem is not None:
        d["memFractionStatic"] = mem
    attention = o.attention_backend or ("triton" if spec.synthetic else None)
    if attention:
        d["attentionBackend"] = attention
    d.update(_graphs(o, spec))
    d.update(_gpus(o))
    d["environment"] = _environment(o, spec)
    d.update(_loading(o, spec))
    if spec.algorithm:
        d.update(_speculative(o, spec, attention))
    return d


def _graphs(o: SmokeOptions, spec: RunSpec) -> dict:
    """CUDA graphs, the sweep's limits and the KV pool (extraArgs keeps this order)."""
    d: dict = {}
    points = o.sweep_points if spec.cuda_graphs else ()  # a server without graphs is not timed
    own_graphs = bool(o.cuda_graph_bs or o.cuda_graph_max_bs)
    max_bs = o.cuda_graph_max_bs or (8 if spec.synthetic and not o.cuda_graph_bs and not points else None)
    if max_bs:
        d["cudaGraphMaxBs"] = max_bs
    if o.no_cuda_graph or not spec.cuda_graphs:
        d["disableCudaGraph"] = True
    extra = []
    if o.cuda_graph_bs:
        extra += ["--cuda-graph-bs", *[b.strip() for b in o.cuda_graph_bs.split(",") if b.strip()]]
    if points:  # the concurrency sweep (sweep.py): every point at once, in its own CUDA graph
        extra += sweep.server_args(list(points), o.requests, graphs=not (o.no_cuda_graph or own_graphs))
    if spec.synthetic and not o.piecewise_cuda_graph:
        extra.append("--disable-piecewise-cuda-graph")
    tokens = kv_tokens(o, spec)
    if tokens:
        extra += ["--max-total-tokens", str(tokens)]
    if extra:
        d["extraArgs"] = extra
    return d


def _gpus(o: SmokeOptions) -> dict:
    if o.tp_size > 1:  # tensor parallelism: --gpu (default 0) and the next ones, as the module's gpus list
        first = o.gpu or 0
        return {"gpus": list(range(first, first + o.tp_size)), "tpSize": o.tp_size}
    return {"gpus": [o.gpu]} if o.gpu is not None else {}


def _environment(o: SmokeOptions, spec: RunSpec) -> dict:
    # Milliseconds in SGLang's log stamps: the start-up phases (startup.py) are read from them.
    env = {"SGLANG_LOG_MS": "1"}
    cache = triton_cache(o)
    if cache:
        env["TRITON_CACHE_DIR"] = cache
    return env


def _loading(o: SmokeOptions, spec: RunSpec) -> dict:
    """How the target loads and what it is asked in: the synthetic pairs' choices, --model's revision."""
    d: dict = {}
    if spec.synthetic:
        d["samplingBackend"] = "pytorch"
        if spec.dummy:
            d["loadFormat"] = "dummy"
        if not spec.tokenizer:  # token ids in and out, no grammar backend
            d.update({"skipTokenizerInit": True, "grammarBackend": "none"})
    if spec.tokenizer and o.grammar:
        d["constrainedJsonDisableAnyWhitespace"] = True  # a random model pads JSON with whitespace without it
    if not spec.synthetic and o.model_revision:
        d["modelRevision"] = o.model_revision
    return d


def _speculative(o: SmokeOptions, spec: RunSpec, attention: str | None) -> dict:
    d: dict = {"draftModel": spec.draft}
    if not spec.synthetic and o.draft_model_revision:
        d["draftModelRevision"] = o.draft_model_revision
    s: dict = {"algorithm": spec.algorithm}
    n = o.num_draft_tokens or (synthetic.PairShape().block_size if spec.synthetic else None)
    if n:
        s["numDraftTokens"] = n
    if spec.algorithm == "DDTREE" and o.ddtree_budget:
        s["ddtreeBudget"] = o.ddtree_budget
    if attention:
        s["draftAttentionBackend"] = attention
    d["speculative"] = s
    if spec.synthetic and spec.dummy:
        d["draftLoadFormat"] = "dummy"
    return d


def triton_cache(o: SmokeOptions) -> str | None:
    """TRITON_CACHE_DIR shared by every server: --triton-cache, none, or smoke's default."""
    if o.triton_cache == "none":
        return None
    if o.triton_cache:
        return str(Path(o.triton_cache).resolve())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dflashctl", "triton")


def kv_tokens(o: SmokeOptions, spec: RunSpec) -> int | None:
    """KV-cache tokens of one server: --max-total-tokens, else the synthetic cap (0: SGLang's)."""
    if o.max_total_tokens is not None:
        return o.max_total_tokens or None
    if not spec.synthetic:
        return None
    return spec.kv_tokens or DEFAULT_SYNTHETIC_KV_TOKENS


def synthetic_kv_tokens(o: SmokeOptions, default: int, block: int) -> int:
    """A synthetic server's KV pool: the default cap, or what the sweep's largest point holds."""
    if not o.sweep_points:
        return default
    return max(default, sweep.kv_tokens_needed(list(o.sweep_points), o.input_len, o.max_new_tokens, block))


def check_pairs(o: SmokeOptions, specs: list[RunSpec]) -> None:
    """A real pair (--model with --draft-model) held to serve's model-pair rules before any server
    starts; its warnings said, its failures raised (exit 79) with each fix."""
    failed, seen = [], set()
    for spec in specs:
        if spec.synthetic or not spec.algorithm or (spec.algorithm, spec.target, spec.draft) in seen:
            continue
        seen.add((spec.algorithm, spec.target, spec.draft))
        cfg = config.from_dict(instance_settings(o, spec, 30000, "sequential"), origin="smoke settings")
        for c in model_check.check(cfg, sglang_args.build_env(cfg), "<smoke's settings>").checks:
            if c.status == "warn":
                say(f"warning: {spec.run}: {c.name}: {c.summary}; fix: {c.fix}")
            elif c.status == "fail":
                failed.append(c)
    if failed:
        listed = "".join(f"\n  - {c.name}: {c.summary}; fix: {c.fix}" for c in failed)
        raise DflashError(f"the model pair does not fit ({len(failed)} problem(s)); no server was started",
                          listed.lstrip("\n"), "apply each fix above (docs/service.md, 'The model pair')",
                          failed[0].exit_code)
