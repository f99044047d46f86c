"""Where one instance's restart goes, before SGLang's own start: serve's steps timed on the GPU host.

    python3 benchmarks/gpu/restart_phases.py --out DIR [--starts 3] [--reps 3] [--fast-start | --no-fast-start]
                                             [--launcher CMD]

A rollout keeps an instance out of rotation for the old instance's stop, the new `dflashctl serve`'s
checks (the driver discovery, the preflight's probes, the model pair and its memory, the GPUs'
health and claim), SGLang's start to ready, the canary and the router's admission. This script times
the part that is serve's own, for instance `a` of benchmarks/gpu/two_instances.py (the rollout's
settings, alone on GPU 0):
  1. each preflight step in-process (--reps times, the median), and each probe child alone;
  2. --starts real starts under `dflashctl serve` (READY=1 on a notify socket this script plays),
     every line serve and SGLang print stamped with the seconds since serve was started, then a
     SIGTERM and the seconds until serve exited (the stop a restart waits for).
Writes DIR/restart-phases.json and DIR/restart-phases.txt (the tables and each start's key lines).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(REPO / "python"), str(Path(__file__).resolve().parent)]
import two_instances  # noqa: E402

from dflashctl.host import gpus, probes  # noqa: E402
from dflashctl.service import config, gpu_claim, preflight  # noqa: E402
from dflashctl.service.child_env import child_env  # noqa: E402
from dflashctl.smoke import oracle  # noqa: E402

KEY_WORDS = ("dflashctl serve:", "faststart", "Load weight", "KV Cache", "Capture cuda graph",
             "The server is fired up", "Uvicorn running", "GET /health_generate")


def timed(fn, reps: int) -> tuple[float, list[float]]:
    runs = []
    for _ in range(reps):
        t = time.monotonic()
        fn()
        runs.append(time.monotonic() - t)
    return statistics.median(runs), runs


def preflight_steps(path: Path, python: str, reps: int) -> dict:
    cfg = config.load(str(path), None)
    env = dict(os.environ)
    out = {}
    out["child_env"] = timed(lambda: child_env(cfg, python, env, None), reps)
    cenv = child_env(cfg, python, env, None).env
    out["probe_checks"] = timed(lambda: probes.preflight(cfg.grammar_backend, cfg.speculative.algorithm,
                                                          python=python, env=cenv), reps)
    out["model_checks"] = timed(lambda: preflight.model_checks(cfg, python, cenv, str(path)), reps)
    out["gpu_claim"] = timed(lambda: gpu_claim.preflight_checks(cfg, python, cenv), reps)
    out["nvml_read"] = timed(lambda: gpus.read(python, gpus.LIBRARY, 20.0, cenv), reps)
    wanted = probes.preflight_probes(cfg.grammar_backend, cfg.speculative.algorithm)
    alone = {}
    for key, (probe, arg) in wanted.items():
        alone[key] = timed(lambda: probes.run_probe(python, probe, arg, 60.0, cenv), reps)
    out["probes_alone"] = alone
    return out


def one_start(path: Path, python: str, work: Path, n: int, launcher: str | None = None) -> dict:
    notify_path = work / f"notify{n}.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
    argv = [python, "-m", "dflashctl", "serve", "--config", str(path), "--log-file", str(work / f"sglang{n}.log")]
    if launcher:  # checking this script without a GPU
        argv += ["--launcher", launcher, "--skip-preflight"]
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip()))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result: dict = {"start": n}
    while "ready_s" not in result and proc.poll() is None and time.monotonic() - t0 < 300:
        try:
            if b"READY=1" in notify.recv(4096):
                result["ready_s"] = round(time.monotonic() - t0, 2)
        except socket.timeout:
            pass
    if proc.poll() is None:
        t1 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        result["stop_s"] = round(time.monotonic() - t1, 2)
    result["exit"] = proc.returncode
    reader.join(5)
    notify.close()
    result["lines"] = [f"{t:7.2f}  {text[:220]}" for t, text in lines if any(k in text for k in KEY_WORDS)]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fast-start", dest="fast", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--launcher", help="the SGLang launcher serve starts, for checking this script without a GPU "
                    "(e.g. \"python3 tests/data/service/standin_server.py\"; the preflight is then skipped)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="restart-phases-"))
    pair = oracle.write_pair(work / "models")
    path = work / "a.json"
    path.write_text(json.dumps(two_instances.settings("a", 31000, pair, work, a.fast), indent=2))
    report: dict = {"fast_start": a.fast, "steps": preflight_steps(path, a.python, a.reps)}
    report["starts"] = [one_start(path, a.python, work, n, a.launcher) for n in range(1, a.starts + 1)]
    (a.out / "restart-phases.json").write_text(json.dumps(report, indent=2))
    text = [f"# serve's steps in-process, median of {a.reps} (seconds; every run in brackets)"]
    for name, value in report["steps"].items():
        if name == "probes_alone":
            for key, (med, runs) in value.items():
                text.append(f"  probe {key:<16} {med:6.2f}  {[round(r, 2) for r in runs]}")
        else:
            text.append(f"  {name:<22} {value[0]:6.2f}  {[round(r, 2) for r in value[1]]}")
    for s in report["starts"]:
        text.append(f"# start {s['start']}: ready {s.get('ready_s')} s, stop {s.get('stop_s')} s, exit {s['exit']}")
        text += s["lines"]
    (a.out / "restart-phases.txt").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
