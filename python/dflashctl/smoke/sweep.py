"""The concurrency sweep (`smoke --sweep 1,2,4,8,16,32,64`): where speculative decoding stops paying.

Speculative decoding trades spare GPU work for fewer decode steps; as batches grow the spare work
runs out and the gain shrinks. The sweep measures every run of the smoke (the baseline, DFLASH
with each drafter) at each concurrency C after its usual phases, as one more phase per point,
`sweep C`: C requests in flight at a time (closed loop), after a short warm-up at the same C. Each
point sends the plan's N prompts over and over, a whole number of times and at least `rounds`
rounds of C requests, so every point decodes the same prompt mix: the poisoned drafter's
predicted acceptance is the same at every point and only the load changes.

Being ordinary phases, the points get everything the smoke's own phases get (report.summarise):
tokens/s, the speed-up over the baseline's same point, each request's output ids against the
baseline's (lossless under load), acceptance against the oracle's rule. This module adds the plan
(how many requests per point, what the servers need for the largest point: CUDA graphs for every
point's batch, room to run them all at once, a KV pool that holds them) and the summary: per run
and point, and the first point at which a speculative run falls below the baseline.
"""

import math

from dflashctl.errors import USAGE, DflashError
from dflashctl.smoke import loadgen

PHASE_PREFIX = "sweep "
MAX_POINT = 4096  # more concurrent requests than any single server here would run
WARM_UP_TOKENS = 32  # as the smoke's own warm-up


def parse(text: str) -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8] (sorted, each once); DflashError (exit 2) for anything else."""
    try:
        points = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        points = []
    if not points or points[0] < 1 or points[-1] > MAX_POINT:
        raise DflashError(f"--sweep {text!r} is not a list of concurrencies", "",
                          f"give whole numbers from 1 to {MAX_POINT}, e.g. --sweep 1,2,4,8,16,32,64", USAGE)
    return points


def phase_name(point: int) -> str:
    return f"{PHASE_PREFIX}{point}"


def point_of(phase: str) -> int | None:
    return int(phase[len(PHASE_PREFIX):]) if phase.startswith(PHASE_PREFIX) else None


def request_count(point: int, prompts: int, rounds: int) -> int:
    """Requests at one point: every prompt equally often, at least `rounds` rounds of `point`."""
    return prompts * math.ceil(rounds * point / prompts)


def prompt_order(point: int, prompts: list, rounds: int) -> list:
    """The prompts one point sends, in order: request i is prompt i mod N."""
    return [prompts[i % len(prompts)] for i in range(request_count(point, len(prompts), rounds))]


def graph_batch_sizes(points: list[int], requests: int) -> list[int]:
    """CUDA-graph batch sizes for a server that runs the sweep: every point's batch exactly (a
    batch above the largest captured size would decode without graphs, and a padded one would
    price work it does not do), plus the smoke's own phases (1 and --requests)."""
    return sorted({1, requests, *points})


def kv_tokens_needed(points: list[int], input_len: int, new_tokens: int, block: int) -> int:
    """KV-cache tokens the largest point holds at once: prompt, output and a draft block of slack
    per request, rounded up to 4096."""
    need = max(points) * (input_len + new_tokens + 2 * block)
    return -(-need // 4096) * 4096


def server_args(points: list[int], requests: int, graphs: bool) -> list[str]:
    """extraArgs for a timed server: run every request of the largest point at once (DFLASH
    otherwise caps a server at 48 running requests: SGLang 0.5.11's server_args sets 48 when
    --max-running-requests is unset) and, with graphs, capture each point's batch."""
    out = ["--max-running-requests", str(max(points))]
    if graphs:
        out += ["--cuda-graph-bs", *map(str, graph_batch_sizes(points, requests))]
    return out


def run_points(run: str, ep: loadgen.Endpoint, prompts: list, a, watch, say) -> list:
    """Each point: a warm-up of `point` short requests at once, then the measured phase. Not
    streamed: a streamed answer costs the server and this client work per chunk, one chunk per
    decode step, so at high load the baseline (a chunk per token) would pay far more of it than
    DFLASH (a chunk per verify step) and the sweep would measure streaming, not decoding. The
    smoke's own phases stream (time to first token, the acceptance histograms); the points keep
    tokens/s, latency, accept length and each request's output ids."""
    out = []
    for point in a.sweep_points:
        order = prompt_order(point, prompts, a.sweep_rounds)
        warm = [loadgen.payload(p, min(a.max_new_tokens, WARM_UP_TOKENS), stream=False) for p in order[:point]]
        loadgen.run_phase(ep, f"{run} {phase_name(point)} warm-up", warm, point, a.request_timeout, watch, say)
        bodies = [loadgen.payload(p, a.max_new_tokens, stream=False) for p in order]
        phase = loadgen.run_phase(ep, f"{run} {phase_name(point)}", bodies, point, a.request_timeout, watch, say)
        phase.name = phase_name(point)
        out.append(phase)
    return out


# --- the summary ------------------------------------------------------------------------------------

def crossing(points: list[dict]) -> tuple[int | None, float | None]:
    """(the concurrency from which a run stays below the baseline: its speed-up is under 1 there
    and at every larger point, the break-even concurrency between it and the point before,
    interpolated in log2 of the concurrency); (None, None) when the largest point is not below,
    (C, None) when every point is."""
    measured = [p for p in points if p.get("speedup") is not None]
    k = len(measured)
    while k and measured[k - 1]["speedup"] < 1.0:
        k -= 1
    if k == len(measured):
        return None, None
    first = measured[k]
    if k == 0:
        return first["concurrency"], None
    before = measured[k - 1]
    c0, s0, c1, s1 = math.log2(before["concurrency"]), before["speedup"], math.log2(first["concurrency"]), first["speedup"]
    return first["concurrency"], round(2 ** (c0 + (s0 - 1.0) / (s0 - s1) * (c1 - c0)), 1)


def _limits(info: dict, points: list[int]) -> list[str]:
    """Where the server ran a point other than asked: fewer requests at once, or without graphs."""
    notes = []
    running = info.get("max_running_requests")
    over = [c for c in points if isinstance(running, int) and c > running]
    if over:
        notes.append(f"the server runs at most {running} requests at once (max_running_requests): points "
                     f"{', '.join(map(str, over))} queue the rest")
    graphs = info.get("cuda_graph_bs") or ([info["cuda_graph_max_bs"]] if info.get("cuda_graph_max_bs") else [])
    if not info.get("disable_cuda_graph") and graphs:
        top = max(graphs)
        eager = [c for c in points if c > top]
        if eager:
            notes.append(f"CUDA graphs go up to batch {top}: points {', '.join(map(str, eager))} decode without them")
    return notes


def summary(result: dict) -> dict | None:
    """The sweep's figures from a summarised result (None when it has no sweep): per run and point,
    where each speculative run falls below the baseline, and one line per run."""
    settings = result.get("settings") or {}
    points = settings.get("sweep") or []
    if not points:
        return None
    runs = []
    for run in result["runs"]:
        rows = []
        for c in points:
            s = run["phases"].get(phase_name(c))
            if s is None:
                continue
            rows.append({"concurrency": c, "requests": s["requests"], "failed": s["failed"],
                         "output_tok_s": s["output_tok_s"], "speedup": s["speedup"],
                         "accept_length": s["accept_length"], "e2e_s_mean": s["e2e_s_mean"],
                         "e2e_s_max": s["e2e_s_max"]})
        entry = {"name": run["name"], "algorithm": run["algorithm"], "points": rows,
                 "server_limits": _limits(run.get("server_info") or {}, points)}
        if run["algorithm"] is not None:
            below, even = crossing(rows)
            entry.update(falls_below_baseline_at=below, break_even=even,
                         below_baseline_at=[r["concurrency"] for r in rows
                                            if r["speedup"] is not None and r["speedup"] < 1.0],
                         line=_line(run["name"], rows, below, even))
        runs.append(entry)
    return {"points": points, "rounds": settings.get("sweep_rounds"),
            "requests": {str(c): request_count(c, settings.get("requests") or 1, settings.get("sweep_rounds") or 1)
                         for c in points},
            "max_new_tokens": settings.get("max_new_tokens"), "runs": runs}


def _x(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}x"


def _line(name: str, rows: list[dict], below: int | None, even: float | None) -> str:
    measured = [r for r in rows if r["speedup"] is not None]
    if not measured:
        return f"{name}: no speed-up measured (no baseline at these points)"
    first, last = measured[0], measured[-1]
    span = f"{_x(first['speedup'])} at {first['concurrency']}, {_x(last['speedup'])} at {last['concurrency']}"
    dips = [r["concurrency"] for r in measured if r["speedup"] < 1.0]
    if below is None and not dips:
        return f"{name}: above the baseline at every point ({span})"
    if below is None:
        return f"{name}: above the baseline at the largest point, below it at {', '.join(map(str, dips))} ({span})"
    if even is None:
        return f"{name}: below the baseline at every point ({span})"
    return (f"{name}: falls below the baseline at {below} concurrent requests and stays below, break-even near "
            f"{even:g} ({span})")


def table(sweep: dict) -> str:
    """Output tokens/s per run and point, the speed-up under each speculative figure."""
    points = sweep["points"]
    head = ["run", *[f"C={c}" for c in points]]
    rows = [head]
    for run in sweep["runs"]:
        by_point = {r["concurrency"]: r for r in run["points"]}
        cells = []
        for c in points:
            r = by_point.get(c)
            if r is None or r["output_tok_s"] is None:
                cells.append("-")
            elif run["algorithm"] is None:
                cells.append(f"{r['output_tok_s']:.0f}")
            else:
                cells.append(f"{r['output_tok_s']:.0f} ({_x(r['speedup'])})")
        rows.append([run["name"], *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"concurrency sweep: output tok/s (x baseline) at C requests in flight, {sweep['max_new_tokens']} new "
             f"tokens each, at least {sweep['rounds']} round(s) per point "
             f"({', '.join(f'{c}: {n}' for c, n in sweep['requests'].items())} requests)"]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    lines.insert(2, "  ".join("-" * w for w in widths))
    lines += [run["line"] for run in sweep["runs"] if run.get("line")]
    lines += [f"note: {run['name']}: {n}" for run in sweep["runs"] for n in run["server_limits"]]
    return "\n".join(lines)
