"""Measuring one server: warm-up, the sequential and concurrent phases, the sweep's points, its
/server_info, the grammar phase, and the recordings --record keeps."""

import json
from dataclasses import asdict
from pathlib import Path

from dflashctl import output
from dflashctl.smoke import grammar, loadgen, router_info, sweep
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.plan import GRAMMAR_RUN, Outcome, Plan
from dflashctl.smoke.report import RunResult

# /server_info fields kept in the result (the whole answer holds every server argument).
SERVER_INFO_KEYS = ("version", "model_path", "speculative_algorithm", "speculative_draft_model_path",
                    "speculative_num_draft_tokens", "speculative_ddtree_budget", "attention_backend",
                    "speculative_draft_attention_backend", "cuda_graph_max_bs", "cuda_graph_bs",
                    "disable_cuda_graph", "disable_piecewise_cuda_graph", "mem_fraction_static",
                    "max_running_requests", "skip_tokenizer_init", "load_format", "tp_size",
                    "grammar_backend", "constrained_json_disable_any_whitespace")


def measure(run: str, algorithm: str | None, ep: loadgen.Endpoint, plan: Plan, o: SmokeOptions,
            outcome: Outcome, watch, startup_s: float | None = None, log: str | None = None,
            throughput: bool = True) -> RunResult:
    """Warm-up, then the sequential and concurrent phases (unless not `throughput`: the grammar
    server), then the grammar phase where the plan has one (its verdict joins `outcome`)."""
    result = RunResult(run, algorithm, ep.base_url, startup_s=startup_s, log=log)
    recordings: list | None = [] if o.record else None
    if throughput:
        result.phases += _throughput(run, ep, plan, o, watch, recordings)
    info = router_info.server_info(ep)[0]  # through a router: one healthy worker's
    result.server_info = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or [{}]
    result.server_info["avg_spec_accept_length"] = (states[0] or {}).get("avg_spec_accept_length")
    grammar_recordings: list | None = [] if o.record else None
    if plan.grammar and (run == GRAMMAR_RUN or plan.pair == "random" or not plan.synthetic):
        outcome.grammar_servers.append(grammar.check_server(run, algorithm, ep, info, o.request_timeout, watch,
                                                            say, grammar_recordings))
    if o.record:
        _record(Path(o.record) / f"{run}.json", plan, info, recordings, grammar_recordings)
    return result


def _throughput(run: str, ep: loadgen.Endpoint, plan: Plan, o: SmokeOptions, watch, recordings) -> list:
    """The timed phases, after their warm-up: sequential, concurrent, then the sweep's points."""
    bodies = [loadgen.payload(p, o.max_new_tokens) for p in plan.prompts]
    _warm_up(run, ep, plan, o, watch)
    phases = []
    if o.sequential_requests:
        seq = loadgen.run_phase(ep, f"{run} sequential", bodies[:o.sequential_requests], 1,
                                o.request_timeout, watch, say, recordings)
        seq.name = "sequential"
        phases.append(seq)
    conc = loadgen.run_phase(ep, f"{run} concurrent", bodies, len(bodies), o.request_timeout, watch, say,
                             recordings)
    conc.name = "concurrent"
    phases.append(conc)
    if o.sweep_points:
        phases += sweep.run_points(run, ep, list(plan.prompts), o, watch, say)  # not recorded: the same prompts
    return phases


def _warm_up(run: str, ep: loadgen.Endpoint, plan: Plan, o: SmokeOptions, watch) -> None:
    """Each phase once, short (32 new tokens), before it is measured: first-use kernel compiles
    and the first replays of every batch size the phases use land here, not in the figures. The
    same prompts as measured (their 32-token prefill may then come from SGLang's prefix cache:
    decoding, not prefill, is what the figures time)."""
    bodies = [loadgen.payload(p, min(o.max_new_tokens, 32)) for p in plan.prompts]
    say(f"{run}: warm-up ({'1 request, then ' if o.sequential_requests else ''}{len(bodies)} at once)")
    phases = ([(bodies[:1], 1)] if o.sequential_requests else []) + [(bodies, len(bodies))]
    for batch, conc in phases:
        warm = loadgen.run_phase(ep, f"{run} warm-up", batch, conc, o.request_timeout, watch, say)
        failed = [r.error for r in warm.requests if r.error]
        if failed:
            say(f"{run}: warm-up failed: {failed[0]}")


def _record(path: Path, plan: Plan, server_info: dict, recordings: list, grammar_recordings: list) -> None:
    """Each distinct request once (sequential and concurrent send the same prompts)."""
    seen, generate = set(), []
    for rec in recordings:
        key = json.dumps(rec.request, sort_keys=True)
        if key not in seen and rec.final is not None:
            seen.add(key)
            generate.append(asdict(rec))
    path.parent.mkdir(parents=True, exist_ok=True)
    output.write(path, json.dumps({"settings": plan.settings, "server_info": server_info,
                                   "generate": generate, "grammar": grammar_recordings}, indent=1) + "\n",
                 "--record")

