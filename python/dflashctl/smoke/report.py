"""Turn measured runs into the smoke verdict, the printed table and the JSON result.

Pure data in, data out: tests feed it what the real client measured against recorded responses.
"""

import statistics
from dataclasses import dataclass, field

from dflashctl.smoke import acceptance, identity, lossless, startup
from dflashctl.smoke.loadgen import PhaseResult

ORACLE_NOTE = ("The oracle pair's weights are set by hand (docs/smoke.md): its drafter is always right, so "
               "DFLASH's accept length is the block size and its speed-up is this host's ceiling for DFLASH "
               "at this block size (a trained drafter lands below it); the poisoned drafter is wrong after "
               "one id in 13, so verify accepts part of each block. Outputs must equal the baseline's, "
               "which must follow the rule x[n] = succ(x[n-15]).")
RANDOM_WEIGHTS_NOTE = ("The synthetic models have random weights: the drafter guesses at random, so "
                       "acceptance length near 1 and a slowdown are expected. These figures prove that "
                       "the stack serves speculative decoding; they are not a quality or speed-up figure. "
                       "Use --model/--draft-model with a real pair for that.")


@dataclass
class RunResult:
    """One server measured: the baseline (algorithm None) or a speculative algorithm."""
    name: str  # "baseline", "DFLASH", "DDTREE", or what /server_info says for --url
    algorithm: str | None
    base_url: str
    startup_s: float | None = None  # launch -> healthy; None for --url
    phases: list[PhaseResult] = field(default_factory=list)
    server_info: dict = field(default_factory=dict)  # the few fields we keep from /server_info
    log: str | None = None
    measured_while_starting: list[str] = field(default_factory=list)  # servers still starting meanwhile
    startup: dict | None = None  # where its start-up time went (startup.phases); None for --url


def _phase_stats(p: PhaseResult) -> dict:
    ok = [r for r in p.requests if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok]
    verify = sum(r.spec_verify_ct for r in ok)
    return {
        "requests": len(p.requests),
        "failed": len(p.requests) - len(ok),
        "concurrency": p.concurrency,
        "output_tokens": tokens,
        "wall_s": round(p.wall_s, 4),
        "output_tok_s": round(tokens / p.wall_s, 2) if p.wall_s > 0 else None,
        "ttft_ms_mean": round(1000 * statistics.fmean(ttft), 2) if ttft else None,
        "ttft_ms_max": round(1000 * max(ttft), 2) if ttft else None,
        "e2e_s_mean": round(statistics.fmean(e2e), 4) if e2e else None,
        "e2e_s_max": round(max(e2e), 4) if e2e else None,
        "spec_verify_ct": verify,
        # completion tokens per verify pass, over all requests (SGLang's per-request definition)
        "accept_length": round(tokens / verify, 4) if verify else None,
    }


# The phases whose requests ask for a stream (measure.py); the sweep's points do not (sweep.py).
STREAMED_PHASES = ("sequential", "concurrent")


def failures(run: RunResult, max_new_tokens: int | None = None) -> list[str]:
    """Why this run must fail the smoke test; empty when it passed. Every request is sent
    ignore_eos with `max_new_tokens`: one answered with another length was cut short (or run on)
    by the server, and the runs no longer decode the same tokens."""
    out = []
    for p in run.phases:
        for r in p.requests:
            where = f"{run.name} {p.name} request {r.index}"
            if r.error is not None:
                out.append(f"{where}: {r.error}")
            elif r.output_tokens == 0:
                out.append(f"{where}: empty response (0 tokens)")
            elif max_new_tokens and r.output_tokens != max_new_tokens:
                out.append(f"{where}: {r.output_tokens} tokens, not the {max_new_tokens} asked (finish reason "
                           f"{r.finish_reason}): the server did not decode to length although it was sent ignore_eos")
            elif p.name in STREAMED_PHASES and r.ttft_s is None:
                out.append(f"{where}: answered in one piece, not as a stream: the smoke's {p.name} phase "
                           "streams (\"stream\": true) for its time to first token and tokens per verify step")
            elif run.algorithm is not None and r.spec_verify_ct == 0:
                out.append(f"{where}: spec_verify_ct is 0 -- {run.algorithm} was not active")
    if not run.phases:
        out.append(f"{run.name}: no requests were measured")
    return out


def rule_failures(run: RunResult, rule: dict[int, list[int]]) -> list[str]:
    """The baseline against the oracle's rule (`rule`: prompt index -> the ids the rule gives)."""
    out = []
    for p in run.phases:
        for r in p.requests:
            want = rule.get(r.index)
            if r.output_ids is None or want is None or r.output_ids == want:
                continue
            at = next((i for i, (x, y) in enumerate(zip(r.output_ids, want)) if x != y),
                      min(len(r.output_ids), len(want)))
            got = r.output_ids[at] if at < len(r.output_ids) else None
            out.append(f"{run.name} {p.name} request {r.index} leaves the oracle's rule at token {at} "
                       f"(rule {want[at] if at < len(want) else None}, got {got}): the target served is not "
                       "the oracle pair as written, or this host computes it wrongly")
            break
    return out


def summarise(runs: list[RunResult], settings: dict, phases_s: dict, synthetic: bool,
              require_lossless: bool = False, expectations: dict | None = None,
              rule: dict[int, list[int]] | None = None) -> dict:
    """The full JSON result; `ok` is False when any run failed a rule in `failures`. A greedy
    output that differs from the baseline's is one of them for the synthetic pair or with
    `require_lossless` (also listed in `lossless_failures`), else a line in `warnings`."""
    base = next((r for r in runs if r.algorithm is None), None)
    base_stats = {p.name: _phase_stats(p) for p in base.phases} if base else {}
    out_runs, problems, not_lossless, warnings, rejected = [], [], [], [], []
    for run in runs:
        stats = {p.name: _phase_stats(p) for p in run.phases}
        for p in run.phases:
            s = stats[p.name]
            b = base_stats.get(p.name, {}).get("output_tok_s")
            s["speedup"] = round(s["output_tok_s"] / b, 3) if b and s["output_tok_s"] and run is not base else None
            if run.algorithm is not None and any(r.commits for r in p.requests):  # streamed phases only
                s["acceptance_histogram"] = acceptance.histogram(p.requests)
        fails = failures(run, settings.get("max_new_tokens"))
        if run is base and rule:
            fails += rule_failures(run, rule)
        accept, low = acceptance.judge(run.name, stats, (expectations or {}).get(run.name))
        if low and not failures(run, settings.get("max_new_tokens")):
            fails.append(low)
            rejected.append(low)
        same, fatal, warning = lossless.judge(base, run, synthetic, require_lossless)
        fails += [fatal] if fatal else []
        not_lossless += [fatal] if fatal else []
        warnings += [warning] if warning else []
        problems += fails
        out_runs.append({
            "name": run.name,
            "algorithm": run.algorithm,
            "base_url": run.base_url,
            "startup_s": None if run.startup_s is None else round(run.startup_s, 2),
            "server_info": run.server_info,
            "phases": stats,
            "requests": {p.name: p.to_json()["requests"] for p in run.phases},
            "log": run.log,
            "measured_while_starting": run.measured_while_starting,
            "lossless": same,
            "acceptance": accept,
            "startup": run.startup,
            "ok": not fails,
        })
    return {
        "ok": not problems,
        "failures": problems,
        "lossless_failures": not_lossless,
        "acceptance_failures": rejected,
        "warnings": warnings,
        "synthetic": synthetic,
        "note": (RANDOM_WEIGHTS_NOTE if settings.get("pair") == "random" else ORACLE_NOTE) if synthetic else None,
        "settings": settings,
        "phases_s": {k: round(v, 2) for k, v in phases_s.items()},
        "runs": out_runs,
    }


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec)


def table(result: dict) -> str:
    """The human summary: one row per run, speed-ups against the baseline's same phase."""
    head = ("run", "start s", "seq tok/s", "x base", "conc tok/s", "x base",
            "TTFT ms", "e2e s", "accept len", "server avg", "verify ct", "= base", "ok")
    rows = [head]
    for run in result["runs"]:
        seq = run["phases"].get("sequential", {})
        conc = run["phases"].get("concurrent", {})
        any_phase = seq or conc
        verify = sum(p.get("spec_verify_ct", 0) for p in run["phases"].values())
        rows.append((
            run["name"],
            _fmt(run["startup_s"], ".1f"),
            _fmt(seq.get("output_tok_s"), ".1f"),
            _fmt(seq.get("speedup"), ".2f"),
            _fmt(conc.get("output_tok_s"), ".1f"),
            _fmt(conc.get("speedup"), ".2f"),
            _fmt(seq.get("ttft_ms_mean", any_phase.get("ttft_ms_mean")), ".1f"),
            _fmt(seq.get("e2e_s_mean", any_phase.get("e2e_s_mean")), ".3f"),
            _fmt(conc.get("accept_length", seq.get("accept_length")), ".3f"),
            _fmt(run["server_info"].get("avg_spec_accept_length"), ".3f"),
            str(verify) if run["algorithm"] else "-",
            lossless.cell(run.get("lossless")),
            "yes" if run["ok"] else "NO",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if result.get("identity"):
        lines.insert(0, identity.line(result["identity"]))
    s = result["settings"]
    lines.append("")
    lines.append(f"{s.get('requests')} prompts x {s.get('max_new_tokens')} new tokens, greedy, ignore_eos; "
                 f"sequential = one at a time ({s.get('sequential_requests')} requests), concurrent = "
                 f"all {s.get('requests')} at once. TTFT and e2e: sequential means, client clock.")
    for run in result["runs"]:
        if run.get("measured_while_starting"):
            lines.append(f"{run['name']} was measured while {', '.join(run['measured_while_starting'])} "
                         "still started on the same GPU (--wait-all measures on a quiet GPU).")
    lines += ["lossless: " + lossless.describe(run["name"], run["lossless"]) for run in result["runs"] if run.get("lossless")]
    lines += acceptance_lines(result)
    lines += startup.lines(result)
    if result.get("note"):
        lines.append(result["note"])
    if result["phases_s"]:
        lines.append("phases: " + ", ".join(f"{k} {v:.1f}s" for k, v in result["phases_s"].items()))
    if identity.health_line(result.get("gpu_health")):
        lines.append(identity.health_line(result["gpu_health"]))
    lines += [f"WARNING: {w}" for w in result.get("warnings", [])]
    for f in result["failures"]:
        lines.append(f"FAILED: {f}")
    return "\n".join(lines)


def acceptance_lines(result: dict) -> list[str]:
    """Per speculative run of the oracle pair: accept length against its band, and the histogram."""
    out = []
    for run in result["runs"]:
        acc = run.get("acceptance")
        if not acc:
            continue
        parts = []
        for phase, f in acc["phases"].items():
            band = f">= {f['min']:g}" if f["max"] is None else f"{f['min']:g}-{f['max']:g}"
            got = "none" if f["accept_length"] is None else f"{f['accept_length']:g}"
            parts.append(f"{phase} {got} (rule {f['predicted']:g}, band {band}{'' if f['ok'] else ', OUT'})")
        hist = (run["phases"].get("concurrent") or {}).get("acceptance_histogram") or {}
        steps = " ".join(f"{k}:{v}" for k, v in hist.get("tokens_per_step", {}).items())
        out.append(f"acceptance: {run['name']} {'; '.join(parts)}; tokens per verify step (concurrent"
                   f"{'' if hist.get('exact') else ', approximate'}) {steps or '-'}")
    return out
