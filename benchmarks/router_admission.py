"""How long sglang-router 0.3.2 takes to admit an instance a rollout puts back (issue 44).

    .venv/bin/python benchmarks/router_admission.py [--reps 5]

The real router (`dflashctl router`, as its unit starts it) with one worker; then, alternating, a
worker whose `/health` answers after 1 s (SGLang 0.5.11 as published: the handler sleeps a second
before it looks for its token) or after 50 ms (with the Nix stack's sglang fix-up promptReadiness,
on an idle instance), each added and waited for the way `dflashctl rollout` puts an instance back
(`RouterAdmin.add`, then `wait_listed` with the rollout's poll, ADMIT_POLL_S; `--poll` for another),
then removed. Prints the median and every figure, as Markdown for docs/benchmarks.md.
"""

import argparse
import http.server
import socketserver
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]
from dflashctl.operations.rollout_machine import ADMIT_POLL_S  # noqa: E402
from dflashctl.operations.router_admin import RouterAdmin  # noqa: E402
from router_harness import Router, listening  # noqa: E402

PUBLISHED_S, FIXED_S = 1.0, 0.05


def worker(health_s: float) -> tuple[socketserver.TCPServer, str]:
    """A worker answering what the router asks of one; /health after `health_s`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/health"):
                time.sleep(health_s)
            body = b"{}" if not self.path.startswith("/health") else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    sock = listening(55535)  # bound and listening already: no race for the port
    server = Server(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def admission(admin: RouterAdmin, health_s: float, poll: float) -> float:
    server, url = worker(health_s)
    try:
        t0 = time.monotonic()
        admin.add(url)
        if not admin.wait_listed(url, True, 60, poll):
            raise SystemExit(f"the router did not admit {url} within 60 s")
        took = time.monotonic() - t0
        admin.remove(url)
        admin.wait_listed(url, False, 60)
        return took
    finally:
        server.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--poll", type=float, default=ADMIT_POLL_S)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="router-admission-"))
    first, first_url = worker(0.0)
    router = Router({"workers": [first_url]}, tmp).start()
    try:
        router.wait_healthy([first_url], timeout=60)
        admin = RouterAdmin(router.url, None)
        runs: dict[float, list[float]] = {PUBLISHED_S: [], FIXED_S: []}
        for _ in range(args.reps):
            for health_s in runs:
                runs[health_s].append(admission(admin, health_s, args.poll))
    finally:
        router.stop()
        first.shutdown()
    print(f"| worker's /health answers after | admitted after (median of {args.reps}, poll {args.poll:g} s) | every run |")
    print("|---|---|---|")
    for health_s, took in runs.items():
        print(f"| {health_s:g} s | {statistics.median(took):.2f} s | {', '.join(f'{t:.2f}' for t in took)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
