"""How fast `dflashctl serve` fails: child death -> supervisor exit, and start -> failing preflight.

    .venv/bin/python benchmarks/service_bench.py [--runs 10] [--broken-python PATH]

Real processes throughout: serve runs as a subprocess with a stand-in SGLang child
(tests/data/service/standin_server.py) that records when it dies; the preflight case points
`--python` at an environment without torch (default: this interpreter, if it lacks torch).
Prints a Markdown table for docs/benchmarks.md.
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"
ENV = dict(os.environ, PYTHONPATH=str(REPO / "python"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def death_to_exit(mode: str, tmp: Path) -> tuple[float, int]:
    death = tmp / "death"
    death.unlink(missing_ok=True)
    settings = tmp / "s.json"
    settings.write_text(json.dumps({
        "name": "bench", "model": "stand-in", "port": free_port(), "startTimeoutSec": 600,
        "environment": {"STANDIN_MODE": mode, "STANDIN_READY_AFTER": "0.5", "STANDIN_DIE_AFTER": "0.5",
                        "STANDIN_DEATH_FILE": str(death)}}))
    proc = subprocess.run([sys.executable, "-m", "dflashctl", "serve", "--config", str(settings),
                           "--skip-preflight", "--log-file", str(tmp / "log"),
                           "--launcher", f"{sys.executable} {STANDIN}"],
                          env=ENV, capture_output=True, text=True, timeout=120)
    exited = time.time()
    return exited - float(death.read_text()), proc.returncode


def start_to_preflight_failure(python: str, tmp: Path) -> tuple[float, int, str]:
    settings = tmp / "p.json"
    settings.write_text(json.dumps({"name": "bench", "model": "stand-in"}))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dflashctl", "serve", "--config", str(settings),
                           "--python", python], env=ENV, capture_output=True, text=True, timeout=120)
    first = next((line for line in proc.stderr.splitlines() if "failed" in line), "")
    return time.monotonic() - t0, proc.returncode, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--broken-python", default=sys.executable,
                    help="an interpreter whose environment lacks torch (default: this one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = []
        for mode, label in (("crash", "child dies before ready -> serve exits"),
                            ("die-after-ready", "child dies after ready -> serve exits")):
            results = [death_to_exit(mode, tmp) for _ in range(args.runs)]
            times = [t for t, _ in results]
            rows.append((label, statistics.median(times), max(times), {rc for _, rc in results}))
        pre = [start_to_preflight_failure(args.broken_python, tmp) for _ in range(args.runs)]
        times = [t for t, _, _ in pre]
        rows.append(("serve start -> failing preflight exits (env without torch or driver)", statistics.median(times),
                     max(times), {rc for _, rc, _ in pre}))
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{args.runs} runs each; preflight failure: {pre[0][2].strip()}\n")
    print("| case | median | max | exit code |\n|---|---|---|---|")
    for label, med, mx, rcs in rows:
        print(f"| {label} | {med * 1000:.0f} ms | {mx * 1000:.0f} ms | {', '.join(map(str, sorted(rcs)))} |")


if __name__ == "__main__":
    main()
