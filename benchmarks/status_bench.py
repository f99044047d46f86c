"""How long `dflashctl status` takes when instances do not answer, and when one does.

    .venv/bin/python benchmarks/status_bench.py [--runs 5] [--tree DIR ...]

Runs `python -m dflashctl status --json --no-router --no-systemd` (its default --window of 2 s)
`--runs` times per case and tree, after one run not counted (byte code written), and prints the
median wall time as a Markdown row per case and tree for docs/benchmarks.md. `--tree` (repeat)
names the `python/` directory of a dflashctl to time (default: this checkout's); the trees take
turns run by run, so a machine whose load changes weighs on each alike. An older commit is timed
from an export: `git archive COMMIT python | tar -x -C /tmp/old`, then `--tree /tmp/old/python
--tree python`.

Cases: four instances where nothing listens (connection refused); one hung instance (a port that
takes the connection and never answers: SGLang stuck, or a firewall that drops); one stand-in
SGLang (tests/data/service/standin_server.py) answering with metrics, where the window is waited
for the rates. No GPU here: NVML is not found, which costs no child process.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"


def free_port() -> int:
    """A free port an instance may have (SGLang 0.5.11 takes port + 10000 too: at most 55535)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] <= 55535:
                return s.getsockname()[1]


def hung_port() -> tuple[socket.socket, int]:
    """A listening socket whose connections are accepted and never answered."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(s.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return s, s.getsockname()[1]


def settings(d: Path, name: str, port: int) -> Path:
    f = d / f"{name}.json"
    f.write_text(json.dumps({"name": name, "model": "m", "port": port, "gpus": [int(name[-1])]}))
    return f


def run_once(tree: Path, files: list[Path], env: dict) -> float:
    argv = [sys.executable, "-m", "dflashctl", "status", "--json", "--no-router", "--no-systemd"]
    argv += [x for f in files for x in ("--instance", str(f))]
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(env, PYTHONPATH=str(tree)), timeout=600)
    assert done.returncode in (0, 1), done.stderr
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", type=Path, action="append", help="a dflashctl python/ tree to time (repeat)")
    a = ap.parse_args()
    trees = a.tree or [REPO / "python"]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        env = dict(os.environ, STATE_DIRECTORY=str(d / "rollout"))
        cases = {"4 instances, nothing listening": [settings(d, f"down{i}", free_port()) for i in range(4)]}
        sock, port = hung_port()
        cases["1 instance that takes the connection and never answers"] = [settings(d, "hung0", port)]
        sport = free_port()
        proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(sport), "--host", "127.0.0.1",
                                 "--model-path", "m", "--enable-metrics"], env=dict(os.environ, STANDIN_READY_AFTER="0"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cases["1 stand-in answering, metrics on"] = [settings(d, "up0", sport)]
        print(f"dflashctl status --json --no-router --no-systemd (default --window 2), median of {a.runs}, "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start")
        print("| case | tree | median s | min s | max s |\n|---|---|---|---|---|")
        try:
            time.sleep(1.5)  # the stand-in listens
            for name, files in cases.items():
                times = {t: [] for t in trees}
                for t in trees:
                    run_once(t, files, env)  # not counted: byte code
                for _ in range(a.runs):
                    for t in trees:
                        times[t].append(run_once(t, files, env))
                for t, got in times.items():
                    print(f"| {name} | {t} | {statistics.median(got):.2f} | {min(got):.2f} | {max(got):.2f} |",
                          flush=True)
        finally:
            proc.kill()
            proc.wait()
            sock.close()
        print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
