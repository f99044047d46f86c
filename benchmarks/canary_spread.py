"""How much the canary's ratios move when nothing changed, and how far a bad build moves them.

    .venv/bin/python benchmarks/canary_spread.py                      # stand-ins, 30 runs
    .venv/bin/python benchmarks/canary_spread.py --runs 50 --json out.json
    # real SGLang (the H200: benchmarks/gpu/canary_spread.sh), the stack's interpreter
    python3 benchmarks/canary_spread.py --python STACK/bin/python --runs 30 --restarts 2 --budget 400

Four instances of the smoke's pairs run under `dflashctl serve` (tests/rollout_harness.py does
systemd's part; stand-ins: `--skip-preflight`, the stand-in SGLang as launcher, every forward pass
--step-delay seconds): `a` and `b` serve the oracle pair with DFLASH, `broken` the same target with
the broken pair's drafter (smoke's `--pair broken`: it accepts about nothing), `plain` the target
alone. Each run takes canary readings (dflashctl.operations.canary.measure, the rollout's own, with
its defaults unless --prompts/--tokens/--repeats) and judges pairs of them at the default thresholds
(canary.judge), as a rollout would: `a` twice; `a` then `b` (another process of the same build, what
a restart onto an identical build gives); in the last --restarts runs `b` before and after a restart
of its unit; in the first --plain-runs runs `plain` twice (speed only); in the first --broken-runs
runs `a` then `broken` (it must fail). Prints per comparison the after/before ratios of acceptance
length and decode speed (median [min, max]), how many verdicts failed, each reading's own spread over
its repeats, and the machine's load; --json keeps it. New runs stop starting once --budget seconds
(from the start) would be passed.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
try:
    import pytest  # noqa: F401 - router_harness marks its tests with it
except ImportError:  # a device image without pytest: the marks are all router_harness asks of it
    import types
    sys.modules["pytest"] = types.SimpleNamespace(mark=types.SimpleNamespace(skipif=lambda *a, **k: None))
from canary_standin import STEP_DELAY_S  # noqa: E402
from rollout_harness import Supervisor, serve_argv  # noqa: E402
from router_harness import ENV, STANDIN  # noqa: E402

from dflashctl.operations import canary  # noqa: E402
from dflashctl.smoke import oracle  # noqa: E402
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS  # noqa: E402

T0 = time.monotonic()
PORTS = {"a": 31020, "b": 31021, "broken": 31022, "plain": 31023}


def settings(name: str, good, bad, work: Path, standin: float | None) -> dict:
    s = {"name": name, "model": str(good.target), "port": PORTS[name], "skipTokenizerInit": True,
         "startTimeoutSec": 600, "cacheDir": str(work / "cache")}
    if name != "plain":
        s["draftModel"] = str((bad if name == "broken" else good).draft)
        s["speculative"] = {"algorithm": "DFLASH", "numDraftTokens": 16}
    if standin is not None:
        return {**s, "environment": {"STANDIN_STEP_DELAY": str(standin)}}
    if name != "plain":
        s["speculative"]["draftAttentionBackend"] = "triton"
    return {**s, "gpus": [0], "allowSharedGpus": True, "attentionBackend": "triton", "samplingBackend": "pytorch",
            "grammarBackend": "none", "memFractionStatic": 0.25, "cudaGraphMaxBs": 8,
            "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)]}


def spread(values: list) -> dict:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4)}


class Comparisons:
    """Verdicts by comparison, and every reading's own spread over its repeats."""

    def __init__(self, s: canary.CanarySettings):
        self.s, self.verdicts, self.within = s, {}, []

    def read(self, port: int) -> canary.Reading:
        r = canary.measure(f"http://127.0.0.1:{port}", None, self.s)
        if r.errors:
            raise RuntimeError(f"the canary failed against port {port}: {r.errors[0]}")
        xs = [x for x in r.decode_tps_repeats if x]
        if xs and r.decode_tps:
            self.within.append((max(xs) - min(xs)) / r.decode_tps)
        return r

    def judge(self, name: str, before: canary.Reading, after: canary.Reading) -> None:
        v = canary.judge(before, after, self.s)
        self.verdicts.setdefault(name, []).append(v)
        print(f"  {name}: {v.summary()}", flush=True)

    def table(self) -> dict:
        return {name: {"runs": len(vs), "failed": sum(not v.ok for v in vs),
                       "accept_ratio": spread([v.acceptance["ratio"] for v in vs]),
                       "speed_ratio": spread([v.speed["ratio"] for v in vs]),
                       "accept_before": spread([v.acceptance["before"] for v in vs]),
                       "speed_before": spread([v.speed["before"] for v in vs])}
                for name, vs in self.verdicts.items()}


def one_run(i: int, args, c: Comparisons, sup: Supervisor) -> None:
    a1, a2 = c.read(PORTS["a"]), c.read(PORTS["a"])
    c.judge("same instance twice", a1, a2)
    b1 = c.read(PORTS["b"])
    c.judge("two instances of one build", a1, b1)
    if i >= args.runs - args.restarts:
        ok, text = sup.restart("b", timeout=600)
        if not ok:
            raise RuntimeError(f"b did not come back from its restart: {text}")
        c.judge("one instance restarted onto the same build", b1, c.read(PORTS["b"]))
    if i < args.plain_runs:
        c.judge("plain instance twice", c.read(PORTS["plain"]), c.read(PORTS["plain"]))
    if i < args.broken_runs:
        c.judge("broken drafter after the good one (must fail)", a1, c.read(PORTS["broken"]))


def run(args, c: Comparisons, work: Path) -> dict:
    good = oracle.write_pair(work / "models")
    bad = oracle.write_pair(work / "models", oracle.OracleShape(draft_offset_error=1))
    standin = None if args.python else args.step_delay
    sup = Supervisor(work)
    for name in PORTS:
        f = work / f"{name}.json"
        f.write_text(json.dumps(settings(name, good, bad, work, standin), indent=2))
        argv = serve_argv(f, STANDIN) if standin is not None else [
            sys.executable, "-m", "dflashctl", "serve", "--config", str(f), "--python", args.python]
        sup.add(name, argv + args.serve_arg, dict(ENV, LOGS_DIRECTORY=str(work)))
    done = {"runs": 0}
    try:
        t = time.monotonic()
        sup.start_all(timeout=600)
        done["start_s"] = round(time.monotonic() - t, 1)
        print(f"four instances ready after {done['start_s']} s", flush=True)
        for i in range(args.runs):
            per_run = (time.monotonic() - T0 - done["start_s"]) / max(done["runs"], 1)
            if time.monotonic() - T0 + per_run * 1.5 + 5 > args.budget:
                done["cut_short"] = f"budget: {done['runs']} of {args.runs} runs"
                break
            one_run(i, args, c, sup)
            done["runs"] += 1
            print(f"run {i + 1}/{args.runs} done ({time.monotonic() - T0:.0f} s)", flush=True)
    finally:
        sup.shutdown()
    return done


def mode(args) -> str:
    if not args.python:
        return f"stand-ins, {args.step_delay} s a pass"
    launcher = os.environ.get("DFLASHCTL_SGLANG_LAUNCHER")  # serve's stand-in for `python -m sglang...`
    return f"dflashctl serve --python {args.python}" + (f", SGLang replaced by {launcher}" if launcher else "")


def markdown(result: dict) -> str:
    def cell(s: dict) -> str:
        return f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]" if s.get("n") else "-"
    lines = ["| comparison | runs | acceptance after/before: median [min, max] | decode speed after/before: "
             "median [min, max] | failed at the defaults |", "|---|---|---|---|---|"]
    for name, t in result["comparisons"].items():
        lines.append(f"| {name} | {t['runs']} | {cell(t['accept_ratio'])} | {cell(t['speed_ratio'])} | "
                     f"{t['failed']} of {t['runs']} |")
    w = result["within_reading_spread"]
    lines.append(f"\nWithin one reading, (max - min) / median of its repeats' decode speeds: {cell(w)} "
                 f"over {w.get('n', 0)} readings.")
    m = result["machine"]
    lines.append(f"Machine: {m['cpus']} CPUs, load average {m['load_before']} before, {m['load_after']} after; "
                 f"{result['mode']}; canary {result['settings']}; {result['seconds']} s.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--restarts", type=int, help="runs (the last ones) that also restart b (stand-ins: every run; "
                   "real SGLang: 2)")
    p.add_argument("--plain-runs", type=int, default=10, help="runs that also read plain twice (10)")
    p.add_argument("--broken-runs", type=int, default=3, help="runs that also read broken (3)")
    p.add_argument("--python", metavar="PATH", help="the stack's interpreter: real SGLang instead of stand-ins")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG", help="passed on to `dflashctl serve`")
    p.add_argument("--step-delay", type=float, default=STEP_DELAY_S, help="stand-ins: seconds a forward pass")
    p.add_argument("--prompts", type=int)
    p.add_argument("--tokens", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--budget", type=float, default=3600, help="seconds from the start; no new run after it")
    p.add_argument("--work", type=Path, help="where the pairs, settings and logs go (default: a temporary one)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.restarts is None:
        args.restarts = 2 if args.python else args.runs
    s = canary.settings_of(argparse.Namespace(
        no_canary=False, canary_prompts=args.prompts, canary_tokens=args.tokens, canary_repeats=args.repeats,
        canary_min_accept_ratio=None, canary_min_speed_ratio=None, canary_expect=[]))
    c = Comparisons(s)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="canary-spread-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            done = run(args, c, work)
        except RuntimeError as e:
            done = {"error": str(e)}
            print(f"stopped: {e}", flush=True)
    result = {"comparisons": c.table(), "within_reading_spread": spread(c.within), "settings": s.to_json(),
              "mode": mode(args),
              **done, "seconds": round(time.monotonic() - T0, 1),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]}}
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if "error" not in done else 1


if __name__ == "__main__":
    sys.exit(main())
