"""An upgrade under load: `dflashctl rollout` against restarting every instance at once (a NixOS switch today).

    .venv/bin/python benchmarks/rollout_bench.py                        # 4 stand-in instances, 8 clients
    .venv/bin/python benchmarks/rollout_bench.py --instances 4 --json out.json
    # real SGLang (the H200): the instances' settings files and the stack's interpreter
    python benchmarks/rollout_bench.py --instance a.json --instance b.json --python STACK/bin/python

Every instance runs under `dflashctl serve` (stand-ins: `--skip-preflight`, the stand-in SGLang as
launcher, which listens only after --listen-after seconds and decodes from --ready-after) inside
tests/rollout_harness.py, which does what systemd does for the units; the router runs as its unit
runs it (`dflashctl router`, the defaults of data/router-unit.json). Closed-loop JSON /generate
requests go to the router only. Each mode gets --before seconds of load, then the upgrade, then
--after seconds: `rolling` runs `dflashctl rollout` (through the harness with --restart-command,
as a host without systemd would), `all` stops every instance and starts them again. Prints a
Markdown table per mode (requests, failed, p50/p99, the longest stretch without any answer, before /
during / after), each instance's time out of rotation, and the whole upgrade's time; --json keeps it.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
from rollout_harness import Rotation, Supervisor, serve_argv  # noqa: E402
from router_harness import ENV, STANDIN, Load, Router, free_port, generate_body, phase  # noqa: E402

from dflashctl.operations import router_unit  # noqa: E402
from dflashctl.service import config  # noqa: E402


def standin_settings(tmp: Path, n: int, token_delay: str, listen_after: float, ready_after: float) -> list[Path]:
    out = []
    for i in range(n):
        p = tmp / f"bench{i}.json"
        p.write_text(json.dumps({"name": f"bench{i}", "model": "standin-model", "port": free_port(config.MAX_PORT),
                                 "startTimeoutSec": 300,
                                 "environment": {"STANDIN_TOKEN_DELAY": token_delay,
                                                 "STANDIN_LISTEN_AFTER": str(listen_after),
                                                 "STANDIN_READY_AFTER": str(listen_after + ready_after)}}))
        out.append(p)
    return out


def set_drafter(files: list[Path], drafter: str | None) -> dict[Path, str]:
    """Each settings file's draftModel set to `drafter` (the next start's definition); the old ones."""
    old = {}
    for f in files:
        s = json.loads(f.read_text())
        old[f] = s.get("draftModel")
        f.write_text(json.dumps({**s, "draftModel": drafter}, indent=2))
    return old


def upgrade(mode: str, sup: Supervisor, files: list[Path], router: Router, tmp: Path, args) -> dict:
    if mode == "all":
        started = time.monotonic()
        outcomes = sup.restart_all(timeout=args.start_timeout)
        router.wait_healthy([config.load(f).base_url for f in files], timeout=args.start_timeout)
        return {"ok": all(ok for ok, _ in outcomes), "seconds": round(time.monotonic() - started, 1)}
    settings = tmp / "router-settings.json"
    settings.write_text(json.dumps(router.settings))
    argv = [sys.executable, "-m", "dflashctl", "rollout", "--router", str(settings), "--restart-command",
            sup.restart_command, "--state-dir", str(tmp / "state"), "--healthy-for", str(args.healthy_for),
            "--batch", str(args.batch), "--json", *sum((["--instance", str(f)] for f in files), []),
            # stand-ins: their speed is the machine's load (docs/benchmarks.md); real instances: judged
            *(["--canary-expect", "speed"] if not args.instance else []),
            *(["--resume"] if mode == "revert" else [])]
    started = time.monotonic()
    r = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=args.start_timeout * len(files) + 600)
    seconds = round(time.monotonic() - started, 1)
    if r.returncode != 0 and mode != "to-drafter":  # rolling to --to-drafter is meant to stop
        raise SystemExit(f"the rollout failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    result = json.loads(r.stdout)
    return {"ok": r.returncode == 0, "exit_code": r.returncode, "seconds": seconds,
            "error": (result.get("error") or {}).get("what"),
            "instances": [{k: s.get(k) for k in ("name", "outcome", "step", "out_of_rotation_s", "restart_to_ready_s",
                                                 "drain_s", "back_in_s")}
                          | {"canary": (s.get("canary") or {}).get("summary") or (s.get("canary") or {}).get("verdict")}
                          for s in result["instances"]],
            "starts": {n: i.starts for n, i in sup.instances.items()}}


def measure(mode: str, sup: Supervisor, files: list[Path], router: Router, tmp: Path, args) -> dict:
    load = Load(router.url + "/generate", generate_body(args.max_new_tokens), clients=args.clients,
                max_requests=10 ** 8, seconds=10 ** 6, timeout=600).start()
    t0 = time.monotonic()
    time.sleep(args.before)
    with Rotation(router) as rotation:
        t1 = time.monotonic()
        done = upgrade(mode, sup, files, router, tmp, args)
        t2 = time.monotonic()
    time.sleep(args.after)
    outcomes = load.stop()
    t3 = time.monotonic()
    return {**done, "least_in_rotation": rotation.least, "seconds_with_none_in_rotation": round(rotation.none_s, 1),
            "phases": {"before": phase(outcomes, t0, t1), "during": phase(outcomes, t1, t2),
                       "after": phase(outcomes, t2, t3 + 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", action="append", default=[], metavar="FILE",
                    help="an instance's settings (real SGLang); default: --instances stand-ins")
    ap.add_argument("--python", help="the stack's interpreter for real SGLang instances")
    ap.add_argument("--instances", type=int, default=4, help="stand-in instances (4)")
    ap.add_argument("--mode", choices=("rolling", "all", "both"), default="both")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--before", type=float, default=10.0, help="seconds of load before the upgrade (10)")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of load after it (10)")
    ap.add_argument("--healthy-for", type=float, default=5.0, help="the rollout's --healthy-for (5)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--token-delay", default="0.005", help="stand-ins: seconds per token")
    ap.add_argument("--listen-after", type=float, default=8.0, help="stand-ins: seconds before they listen (8)")
    ap.add_argument("--ready-after", type=float, default=2.0, help="stand-ins: seconds of 503 after that (2)")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--start-together", action="store_true",
                    help="start every instance at once (each on its own GPUs; default: one after the other)")
    ap.add_argument("--to-drafter", metavar="PATH",
                    help="roll to this drafter (e.g. the smoke's broken one), expecting the canary to stop it at "
                         "the first instance; then revert (the old drafter, `rollout --resume`), then roll the "
                         "identical build (modes to-drafter, revert, rolling; --mode is ignored)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--work-dir", metavar="DIR", help="keep the logs here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as d:
        tmp = Path(args.work_dir or d)
        tmp.mkdir(parents=True, exist_ok=True)
        standin = not args.instance
        files = [Path(f) for f in args.instance] or standin_settings(
            tmp, args.instances, args.token_delay, args.listen_after, args.ready_after)
        sup = Supervisor(tmp)
        for f in files:
            cfg = config.load(f)
            argv = serve_argv(f, STANDIN) if standin else \
                [sys.executable, "-m", "dflashctl", "serve", "--config", str(f), "--python", args.python]
            sup.add(cfg.name, argv, dict(ENV, LOGS_DIRECTORY=str(tmp)))
        sup.serve_control()
        for inst in sup.instances.values() if args.start_together else ():
            sup._start(inst)
        for inst in sup.instances.values():  # one after the other: SGLang sizes its pool from what is free
            if not args.start_together:
                sup._start(inst)
            ok, text = sup.wait_started(inst, args.start_timeout)
            if not ok:
                raise SystemExit(f"{inst.name} did not start: {text}; see {inst.log}")
        settings = router_unit.settings_for([config.load(f) for f in files],
                                            {"port": free_port(), "metricsPort": free_port()})
        settings.pop("instanceUnits")
        router = Router(settings, tmp).start()
        results = {}
        try:
            router.wait_healthy(settings["workers"], timeout=120)
            modes = (("to-drafter", "revert", "rolling") if args.to_drafter else
                     ("rolling", "all") if args.mode == "both" else (args.mode,))
            old = None
            for mode in modes:
                if mode == "to-drafter":
                    old = set_drafter(files, args.to_drafter)
                elif mode == "revert":
                    for f, drafter in old.items():
                        set_drafter([f], drafter)
                results[mode] = measure(mode, sup, files, router, tmp, args)
                print(json.dumps({mode: results[mode]}), flush=True)  # kept if a later mode is cut short
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        finally:
            router.stop()
            sup.shutdown()
    out = {"machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
           "workers": "stand-in SGLang" if standin else "SGLang", "instances": len(files),
           "clients": args.clients, "max_new_tokens": args.max_new_tokens, "batch": args.batch,
           "healthy_for_s": args.healthy_for,
           "stand_in_start": {"listen_after_s": args.listen_after, "ready_after_s": args.ready_after} if standin else None,
           "modes": results}
    print(f"{out['workers']} x{out['instances']} behind sglang-router 0.3.2, {args.clients} closed-loop clients, "
          f"/generate {args.max_new_tokens} tokens; {out['machine']}\n")
    print("| upgrade | phase | seconds | requests | failed | p50 | p99 | longest without an answer |\n"
          "|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        for name, p in r["phases"].items():
            print(f"| {mode} | {name} | {p['seconds']} | {p['requests']} | {p['failed']} | {p['p50_s']} s | "
                  f"{p['p99_s']} s | {p['longest_without_answer_s']} s |")
    for mode, r in results.items():
        print(f"\n{mode}: upgrade took {r['seconds']} s; at least {r['least_in_rotation']} worker(s) in rotation, "
              f"{r['seconds_with_none_in_rotation']} s with none; exit {r.get('exit_code', 0)}"
              + (f": {r['error']}" if r.get("error") else "") + (f"; starts {r['starts']}" if r.get("starts") else ""))
        for s in r.get("instances", []):
            print(f"  {s['name']}: {s.get('outcome', 'done')}{' at ' + s['step'] if s.get('step') else ''}, out of "
                  f"rotation {s['out_of_rotation_s']} s (restart to ready {s['restart_to_ready_s']} s, drain "
                  f"{s['drain_s']} s), canary {s['canary']}")
        for name, p in r["phases"].items():
            for e in p["errors"]:
                print(f"  {name}: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
