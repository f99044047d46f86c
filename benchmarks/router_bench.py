"""Load and a fault through the router: N clients, kill -9 of one instance mid-load, its restart.

    .venv/bin/python benchmarks/router_bench.py                      # 2 stand-in instances, 8 clients, 1 min
    .venv/bin/python benchmarks/router_bench.py --clients 8 --minutes 2 --json out.json
    # real SGLang (the H200): the instances' settings files and the stack's interpreter
    python benchmarks/router_bench.py --instance a.json --instance b.json --python STACK/bin/python

Every instance runs under `dflashctl serve --config` (stand-ins: `--skip-preflight --launcher
standin_server.py`), restarted by this script RestartSec after it exits, as systemd would; the
router runs as its unit runs it (`dflashctl router`, settings from `router_unit.settings_for`, so
the defaults under test are data/router-unit.json's). Clients are closed-loop JSON /generate
requests to the router only (127.0.0.1), bounded by --max-requests and --minutes. At --kill-at
seconds the SGLang process of the first instance (or --victim) gets SIGKILL. Instances start one
after the other, each once the one before answers /health, as SGLang's pool depends on it. Phases: before the kill, during
(kill to the router's re-admission of the restarted instance), after. Retries are the router's own
count (smg_worker_retries_total on its metrics port). Prints a Markdown table; --json keeps it all.
"""

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
from router_harness import ENV, STANDIN, Load, Router, free_port, generate_body, phase, request  # noqa: E402

from dflashctl.operations import router_unit  # noqa: E402
from dflashctl.service import config  # noqa: E402


class Supervised:
    """`dflashctl serve` for one instance, restarted `restart_sec` after each exit (systemd's role)."""

    def __init__(self, settings: Path, python: str | None, standin: bool, restart_sec: float, log: Path):
        self.cfg = config.load(settings)
        self.argv = [sys.executable, "-m", "dflashctl", "serve", "--config", str(settings)]
        if python:
            self.argv += ["--python", python]
        if standin:
            self.argv += ["--skip-preflight", "--launcher", f"{sys.executable} {STANDIN}"]
        self.restart_sec, self.log = restart_sec, log
        self.proc: subprocess.Popen | None = None
        self.events: list[tuple[str, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._done.is_set():
            self.events.append(("start", time.monotonic()))
            env = dict(ENV, LOGS_DIRECTORY=str(self.log.parent))
            self.proc = subprocess.Popen(self.argv, env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
            rc = self.proc.wait()
            self.events.append((f"exit {rc}", time.monotonic()))
            if self._done.wait(self.restart_sec):
                return

    def start(self) -> "Supervised":
        self._thread.start()
        return self

    def wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while request(self.cfg.base_url + "/health", timeout=5)[0] != 200:
            if time.monotonic() > deadline:
                raise SystemExit(f"instance {self.cfg.name} not up after {timeout} s; see {self.log}")
            time.sleep(0.2)

    def sglang_pid(self) -> int | None:
        """serve's child: SGLang (or the stand-in)."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def stop(self) -> None:
        self._done.set()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def retries(metrics_url: str) -> float:
    status, body = request(metrics_url, timeout=5)
    if status != 200:
        return float("nan")
    return sum(float(m.group(1)) for m in
               re.finditer(r"^smg_worker_retries_total\{[^}]*\} (\S+)$", body.decode(), re.M))


def standin_settings(tmp: Path, n: int, token_delay: str) -> list[Path]:
    out = []
    for i in range(n):
        p = tmp / f"bench{i}.json"
        p.write_text(json.dumps({"name": f"bench{i}", "model": "standin-model", "port": free_port(config.MAX_PORT),
                                 "startTimeoutSec": 120,
                                 "environment": {"STANDIN_TOKEN_DELAY": token_delay,
                                                 "STANDIN_READY_AFTER": "0.5"}}))
        out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", action="append", default=[], metavar="FILE",
                    help="an instance's settings (real SGLang); default: two stand-ins")
    ap.add_argument("--python", help="the stack's interpreter for real SGLang instances")
    ap.add_argument("--router-python", default=sys.executable, help="interpreter with sglang-router 0.3.2")
    ap.add_argument("--router-settings", metavar="FILE", help="router settings over the defaults")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--max-requests", type=int, default=200_000)
    ap.add_argument("--after", type=float, default=20.0,
                    help="seconds of load at least after the re-admission, past --minutes if need be (20)")
    ap.add_argument("--kill-at", type=float, default=None, help="seconds into the load (default: a fifth)")
    ap.add_argument("--victim", metavar="NAME", help="the instance to kill (default: the first)")
    ap.add_argument("--restart-sec", type=float, default=5.0, help="the unit's RestartSec (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--token-delay", default="0.005", help="stand-ins: seconds per token")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--start-together", action="store_true",
                    help="start every instance at once (each on its own GPUs; default: one after the other)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--work-dir", metavar="DIR", help="keep the logs here (default: a temporary directory)")
    args = ap.parse_args()
    seconds = args.minutes * 60
    kill_at = args.kill_at if args.kill_at is not None else seconds / 5
    with tempfile.TemporaryDirectory(prefix="router-bench-") as d:
        tmp = Path(args.work_dir or d)
        tmp.mkdir(parents=True, exist_ok=True)
        standin = not args.instance
        files = [Path(f) for f in args.instance] or standin_settings(tmp, 2, args.token_delay)
        instances = [Supervised(f, args.python, standin, args.restart_sec, tmp / f"serve-{f.stem}.log")
                     for f in files]
        for i in instances:  # one after the other: SGLang sizes its pool from what the others left free
            i.start()
            if not args.start_together:
                i.wait_up(args.start_timeout)
        for i in instances if args.start_together else ():
            i.wait_up(args.start_timeout)
        given = json.loads(Path(args.router_settings).read_text()) if args.router_settings else {}
        settings = router_unit.settings_for([i.cfg for i in instances],
                                            {"port": free_port(), "metricsPort": free_port(), **given})
        settings.pop("instanceUnits")
        r = Router(settings, tmp).start()
        metrics = f"http://127.0.0.1:{settings['metricsPort']}/metrics"
        victim = next((i for i in instances if i.cfg.name == args.victim), instances[0])
        try:
            r.wait_healthy(settings["workers"], timeout=120)
            t_start = time.monotonic()
            load = Load(r.url + "/generate", generate_body(args.max_new_tokens), clients=args.clients,
                        max_requests=args.max_requests, seconds=seconds + args.after, timeout=600).start()
            time.sleep(kill_at)
            retried_before = retries(metrics)
            pid = victim.sglang_pid()
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            marks = {"unhealthy": None, "instance_up": None, "admitted": None}
            while time.monotonic() < t_start + seconds and load.count() < args.max_requests:
                healthy = r.workers().get(victim.cfg.base_url)
                now = time.monotonic()
                if marks["unhealthy"] is None and healthy is False:
                    marks["unhealthy"] = now
                restarted = any(e == "start" and t > t_kill for e, t in victim.events)
                if restarted and marks["instance_up"] is None and \
                        request(victim.cfg.base_url + "/health", timeout=2)[0] == 200:
                    marks["instance_up"] = now
                if marks["instance_up"] is not None and healthy:
                    marks["admitted"] = now
                    break
                time.sleep(0.2)
            retried_during = retries(metrics)
            # at least --after seconds of load once it is back, even past --minutes
            end = max(t_start + seconds, (marks["admitted"] or 0) + args.after)
            while marks["admitted"] and time.monotonic() < end and load.count() < args.max_requests:
                time.sleep(0.5)
            outcomes = load.stop()
            t_end = time.monotonic()
            retried_after = retries(metrics)
        finally:
            r.stop()
            for i in instances:
                i.stop()
        t_adm = marks["admitted"] or t_end
        exits = [(e, round(t - t_kill, 2)) for e, t in victim.events if t >= t_kill]
        result = {
            "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
            "workers": "stand-in SGLang" if standin else "SGLang", "instances": len(instances),
            "clients": args.clients, "max_new_tokens": args.max_new_tokens,
            "router": {k: settings[k] for k in ("policy", "healthCheckIntervalSec", "healthCheckTimeoutSec",
                                                "healthFailureThreshold", "healthSuccessThreshold",
                                                "circuitBreakerFailures", "circuitBreakerOpenSec",
                                                "retries", "requestTimeoutSec")},
            "kill_at_s": round(t_kill - t_start, 1), "restart_sec": args.restart_sec,
            "victim_events_after_kill": exits,
            "kill_to_marked_unhealthy_s": round(marks["unhealthy"] - t_kill, 2) if marks["unhealthy"] else None,
            "kill_to_instance_up_s": round(marks["instance_up"] - t_kill, 2) if marks["instance_up"] else None,
            "instance_up_to_admitted_s": round(marks["admitted"] - marks["instance_up"], 2)
            if marks["admitted"] else None,
            "kill_to_admitted_s": round(marks["admitted"] - t_kill, 2) if marks["admitted"] else None,
            "phases": {"before": {**phase(outcomes, t_start, t_kill), "retried": retried_before},
                       "during": {**phase(outcomes, t_kill, t_adm), "retried": retried_during - retried_before},
                       "after": {**phase(outcomes, t_adm, t_end + 1), "retried": retried_after - retried_during}},
        }
        if standin:
            names = {i.cfg.port: i.cfg.name for i in instances}
            result["served_by"] = {names[p]: sum(o.worker == p for o in outcomes) for p in names}
            result["served_by_victim_after_admission"] = sum(
                o.worker == victim.cfg.port for o in outcomes if o.start >= t_adm)
    print(f"{result['workers']} x{result['instances']} behind sglang-router 0.3.2, {args.clients} clients, "
          f"/generate {args.max_new_tokens} tokens; {result['machine']}; kill -9 at {result['kill_at_s']} s, "
          f"restart after {args.restart_sec} s; marked unhealthy {result['kill_to_marked_unhealthy_s']} s "
          f"after the kill, instance up at {result['kill_to_instance_up_s']} s, re-admitted "
          f"{result['instance_up_to_admitted_s']} s later ({result['kill_to_admitted_s']} s after the kill)\n")
    print("| phase | seconds | requests | failed | retried | p50 | p99 |\n|---|---|---|---|---|---|---|")
    for name, p in result["phases"].items():
        print(f"| {name} | {p['seconds']} | {p['requests']} | {p['failed']} | {p['retried']:g} | "
              f"{p['p50_s']} s | {p['p99_s']} s |")
    if "served_by" in result:
        print(f"\nserved by: {result['served_by']} ({victim.cfg.name} was killed; "
              f"{result['served_by_victim_after_admission']} served by it after re-admission)")
    for name, p in result["phases"].items():
        for e in p["errors"]:
            print(f"{name}: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
