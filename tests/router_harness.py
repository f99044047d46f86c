"""Real processes for the router tests and benchmark: stand-in SGLang workers, the real router, load.

Everything listens on and talks to 127.0.0.1 only. The router is started the way its unit starts
it, `dflashctl router --config FILE --python PYTHON` (which execs sglang-router 0.3.2), so the flags
under test are the ones `operations/router.py` writes. Load is closed-loop: each client sends its next
request when the previous one is answered, bounded by a request count and a deadline.
"""

import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dflashctl.smoke import ports

HAVE_ROUTER = importlib.util.find_spec("sglang_router") is not None
needs_router = pytest.mark.skipif(
    not HAVE_ROUTER, reason="sglang-router 0.3.2 is not installed (pip install -e 'python[test]'; tests/run does)")
REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(REPO / "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))


# The defaults as docs/service.md ("Router", settings table) gives them, each with what was measured
# behind it (health checks every 2 s and a dead worker out after two: ~4 s; 3 circuit-breaker
# failures stop 0.3.2's retries going back to a dead worker; ...). Written here, not read.
MEASURED_DEFAULTS = {
    "host": "127.0.0.1", "port": 30080, "metricsHost": "127.0.0.1", "metricsPort": 30081, "policy": "round_robin",
    "healthCheckIntervalSec": 2, "healthCheckTimeoutSec": 5, "healthFailureThreshold": 2,
    "healthSuccessThreshold": 1, "circuitBreakerFailures": 3, "circuitBreakerOpenSec": 5, "retries": 3,
    "requestTimeoutSec": 300, "workerStartupTimeoutSec": 3600, "drainSec": 30,
}


def free_port(at_most: int = 65535) -> int:
    """A free port on 127.0.0.1 outside the kernel's ephemeral range (the smoke's choice, no
    outgoing connection can take it before its server binds it); `at_most` 55535 for an instance
    (SGLang takes port + 10000 too)."""
    return ports.free_port(at_most)


def listening(at_most: int = 65535) -> socket.socket:
    """A socket bound and listening on 127.0.0.1 at a port free_port chooses (bound here: no race
    left, but another program may have bound that port since it was chosen: then another)."""
    for _ in range(20):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", free_port(at_most)))
        except OSError:
            s.close()
            continue
        s.listen(16)
        return s
    raise RuntimeError("20 ports chosen were all taken before they could be bound")


def request(url: str, method: str = "GET", body=None, headers: dict | None = None,
            timeout: float = 30.0) -> tuple[int, bytes]:
    """(status, body); a transport error is status 0 with the error as the body."""
    parts = urlsplit(url)
    host, port, path = parts.hostname, parts.port, parts.path or "/"
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, repr(e).encode()
    finally:
        conn.close()


def generate_body(n: int = 4, stream: bool = False) -> dict:
    return {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": n, "temperature": 0},
            "stream": stream}


def served_by(body: bytes) -> int | None:
    """The stand-in's port in its answer's id ("standin-<port>-<n>"), JSON or the first SSE event."""
    text = body.decode(errors="replace")
    marker = text.find("standin-")
    if marker < 0:
        return None
    return int(text[marker + 8:].split("-", 1)[0])


class Standin:
    """One stand-in SGLang worker on 127.0.0.1:port; kill -9 and restart on the same port."""

    def __init__(self, port: int, log_dir: Path, **env: str):
        self.port, self.log_dir = port, log_dir
        self.env = dict(ENV, STANDIN_MODE="healthy", STANDIN_READY_AFTER="0", **env)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Standin":
        self.starts += 1
        log = open(self.log_dir / f"standin-{self.port}-{self.starts}.log", "w")
        self.proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(self.port),
                                      "--host", "127.0.0.1", "--model-path", "standin-model"],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while request(self.url + "/health", timeout=2)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stand-in on {self.port} did not come up (exit {self.proc.poll()})")
            time.sleep(0.05)
        return self

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        stop_standin(self.proc)


def stop_standin(proc: subprocess.Popen | None) -> None:
    """Stop a stand-in server as a service is stopped: SIGTERM, SIGKILL after 10 s. Not SIGKILL
    first: its handler ends the scheduler and detokenizer, and a detokenizer still starting (SGLang
    does not wait for it) would outlive a SIGKILL of the leader."""
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # a test may have stopped it
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Router:
    """`dflashctl router` with the given settings (workers etc.), on 127.0.0.1."""

    def __init__(self, settings: dict, tmp: Path, env: dict | None = None):
        self.settings = {"port": free_port(), "metricsPort": free_port(), **settings}
        self.tmp, self.env = tmp, dict(ENV, HF_HUB_OFFLINE="1", **(env or {}))
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "router.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings['port']}"

    def start(self) -> "Router":
        path = self.tmp / "router.json"
        path.write_text(json.dumps(self.settings))
        self.proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "router", "--config", str(path),
                                      "--python", sys.executable], env=self.env,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        return self

    def sync(self, **changes) -> subprocess.CompletedProcess:
        """Rewrite the settings file and run the unit's ExecReload, `dflashctl router --sync`."""
        self.settings.update(changes)
        path = self.tmp / "router.json"
        path.write_text(json.dumps(self.settings))
        return subprocess.run([sys.executable, "-m", "dflashctl", "router", "--config", str(path),
                               "--python", sys.executable, "--sync"], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def workers(self, headers: dict | None = None) -> dict[str, bool]:
        status, body = request(self.url + "/workers", headers=headers, timeout=5)
        if status != 200:
            return {}
        return {w["url"]: w["is_healthy"] for w in json.loads(body)["workers"]}

    def wait_healthy(self, urls: list[str], timeout: float = 60.0, headers: dict | None = None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.workers(headers)
            if all(seen.get(u) for u in urls):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {urls} not healthy in the router after {timeout} s "
                                   f"(it lists {seen}); log: {self.tail()}")
            time.sleep(0.2)

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None


@dataclass
class Outcome:
    start: float  # time.monotonic() when sent
    end: float
    status: int  # 0: transport error
    worker: int | None  # the stand-in's port, when it says
    error: str = ""


@dataclass
class Load:
    """`clients` closed-loop clients sending `body` to `url` until `stop()`, `max_requests` or `seconds`."""

    url: str
    body: dict
    clients: int = 4
    max_requests: int = 5000
    seconds: float = 60.0
    headers: dict = field(default_factory=dict)
    timeout: float = 60.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]

    def _client(self) -> None:
        deadline = time.monotonic() + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if len(self.outcomes) >= self.max_requests:
                    return
            t0 = time.monotonic()
            status, body = request(self.url, "POST", self.body, self.headers, self.timeout)
            out = Outcome(t0, time.monotonic(), status, served_by(body) if status == 200 else None,
                          "" if status == 200 else body[:300].decode(errors="replace"))
            with self._lock:
                self.outcomes.append(out)

    def start(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(list(self.outcomes)):
                    return True
            time.sleep(0.05)
        return False

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout + 5)
        with self._lock:
            return list(self.outcomes)


def phase(outcomes: list[Outcome], t0: float, t1: float) -> dict:
    """Requests sent in [t0, t1): how many, how many failed, latency p50/p99 of the answered ones,
    the longest stretch without any successful answer, and the first few distinct errors."""
    sel = [o for o in outcomes if t0 <= o.start < t1]
    lat = sorted(o.end - o.start for o in sel if o.status == 200)

    def q(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None
    ends = sorted(o.end for o in sel if o.status == 200)
    until = min(t1, max((o.end for o in sel), default=t1))  # the window may reach past the load's end
    gaps = [b - a for a, b in zip([t0] + ends, ends + [until])]
    return {"requests": len(sel), "failed": sum(o.status != 200 for o in sel),
            "p50_s": q(0.50), "p99_s": q(0.99), "seconds": round(t1 - t0, 1),
            "longest_without_answer_s": round(max(gaps), 2) if gaps else None,
            "errors": sorted({f"{o.status} {o.error[:120]}" for o in sel if o.status != 200})[:5]}

