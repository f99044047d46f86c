"""Port races under a churn of outgoing loopback connections (issue 42).

    .venv/bin/python benchmarks/port_churn.py [--runs 10] [--churners 2] [--picks 400] [TEST ...]

Background processes (--churners) open TCP connections to a loopback sink as fast as they can,
each keeping its last --hold open (a pool of client connections) and closing the older ones: each
connection takes a port from the kernel's ephemeral range, held while open and left in TIME_WAIT
after, as on a host busy with other work; and they bind sockets to port 0 (--listeners kept, the
older given back), as programs that take "any free port" do. Linux gives connect() and bind(0)
ports of opposite parity: a port chosen by binding port 0 is lost to connections only once they
hold most of the range (the default holds 18000 of its 28232 ports), and to the other programs
binding port 0 at once. Under that churn it measures, and prints as
Markdown for docs/benchmarks.md:

1. how often a port is lost between its choice and its bind (`--picks` ports per way, each bound
   1 s after it was chosen): chosen by binding port 0 and closing (the old way: the ephemeral
   range) against `dflashctl.smoke.ports.free_port` (outside it);
2. the TEST files (default: the smoke's and the router's tests) run `--runs` times, one pytest
   each: passed, failed, and whether a failed run's output names a taken port (EADDRINUSE).

The churn's rate is reported too: on a loaded machine it is lower, and so is the pressure.
"""

import argparse
import collections
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
from dflashctl.smoke import ports  # noqa: E402

DEFAULT_TESTS = ["tests/smoke/test_smoke.py", "tests/smoke/test_smoke_ports.py", "tests/operations/test_router.py"]
TAKEN = re.compile(r"EADDRINUSE|\[Errno 98\]|address already in use", re.IGNORECASE)


def churn(seconds_file: str, hold: int, address: str, listeners: int) -> None:
    """The churner: a sink and connections to it until killed, the last `hold` of them kept open (a
    client's pool of connections; each holds its port), and between two connections a socket bound
    to port 0, the last `listeners` of them kept (programs that take "any free port": ZeroMQ's and
    NCCL's helpers, test servers); writes its count."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    sink = socket.socket()
    sink.bind((address, 0))
    sink.listen(1024)

    def accept():
        while True:
            conn, _ = sink.accept()
            conn.close()
    threading.Thread(target=accept, daemon=True).start()
    target, count, start = sink.getsockname(), 0, time.monotonic()
    held, bound = collections.deque(), collections.deque()
    while True:
        try:
            held.append(socket.create_connection(target, timeout=2))
            count += 1
            while len(held) > hold:
                held.popleft().close()
            if listeners:
                s = socket.socket()
                s.bind((address, 0))
                s.listen(1)
                bound.append(s)
                while len(bound) > listeners:
                    bound.popleft().close()
        except OSError:
            time.sleep(0.01)  # the range is exhausted for a moment (TIME_WAIT): as on a busy host
        if count % 500 == 0:
            Path(seconds_file).write_text(f"{count} {time.monotonic() - start:.1f}")


def old_pick() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lost(pick, picks: int, wait: float = 1.0) -> int:
    """Of `picks` ports chosen by `pick`, how many another socket took within `wait` seconds."""
    chosen = [pick() for _ in range(picks)]
    time.sleep(wait)
    return sum(not ports.is_free(p) for p in chosen)


def run_tests(tests: list[str], runs: int) -> list[dict]:
    out = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="port-churn-") as tmp:
            env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=str(REPO / "python"))
            t = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                                   *[str(REPO / x) for x in tests]], cwd=REPO / "tests", env=env,
                                  capture_output=True, text=True)
        text = done.stdout + done.stderr
        summary = text.strip().splitlines()[-1] if text.strip() else ""
        failed = [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        out.append({"run": i + 1, "summary": summary, "failed": len(failed),
                    "port": "yes" if failed and TAKEN.search(text) else "no", "s": time.monotonic() - t})
        print(f"run {i + 1}: {summary}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--churners", type=int, default=2)
    ap.add_argument("--picks", type=int, default=400)
    ap.add_argument("--hold", type=int, default=9000, help="connections each churner keeps open")
    ap.add_argument("--address", default="127.0.0.1",
                    help="where the churn connects: the sink listens there (loopback gets TIME_WAIT reuse "
                         "from the kernel, tcp_tw_reuse=2; this host's own address does not)")
    ap.add_argument("--listeners", type=int, default=2000,
                    help="sockets bound to port 0 each churner keeps (taken and given back as it goes)")
    ap.add_argument("--churn", help=argparse.SUPPRESS)  # internal: be a churner, writing to this file
    ap.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    a = ap.parse_args()
    if a.churn:
        churn(a.churn, a.hold, a.address, a.listeners)
        return
    tmp = Path(tempfile.mkdtemp(prefix="port-churn-"))
    counters = [tmp / f"churn{i}" for i in range(a.churners)]
    churners = [subprocess.Popen([sys.executable, __file__, "--churn", str(c), "--hold", str(a.hold),
                                  "--address", a.address, "--listeners", str(a.listeners)])
                for c in counters]
    try:
        time.sleep(10)  # the churn under way, its connections held
        print(f"ephemeral range {ports.ephemeral_range()}; choices outside it: "
              + ", ".join(f"{r.start}-{r.stop - 1}" for r in ports.candidates(ephemeral=ports.ephemeral_range())))
        print("\n| ports chosen | lost within 1 s |\n|---|---|")
        print(f"| bind port 0, close (old) | {lost(old_pick, a.picks)} of {a.picks} |")
        print(f"| `ports.free_port` (new) | {lost(ports.free_port, a.picks)} of {a.picks} |")
        results = run_tests(a.tests, a.runs) if a.runs else []
    finally:
        for c in churners:
            c.kill()
            c.wait()
    rate = 0.0
    for c in counters:
        try:
            n, s = c.read_text().split()
            rate += int(n) / float(s)
        except (OSError, ValueError, ZeroDivisionError):
            pass
    print(f"\nchurn: {a.churners} process(es), about {rate:.0f} connections/s in all")
    if results:
        print("\n| run | result | failures | a taken port in the output | s |\n|---|---|---|---|---|")
        for r in results:
            print(f"| {r['run']} | {r['summary']} | {r['failed']} | {r['port']} | {r['s']:.0f} |")


if __name__ == "__main__":
    main()
