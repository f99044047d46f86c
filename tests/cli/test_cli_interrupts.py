"""`--json` keeps its promise when a command is stopped (issue 42): Ctrl-C (SIGINT) or SIGTERM sent
to a real `dflashctl` process in the middle of its work ends it with exit 130, one JSON object on
stdout whose error is the interruption, the paragraph and its fix on stderr, and nothing of its
work left running.

"In the middle" is made certain, never guessed: each command is held at a point the test can see
(an HTTP server that has taken the command's connection and answers one header line a second, so
no timeout ends the wait; a probe interpreter that has written its pid and sleeps), and the signal
is sent only once it is there.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DEADLINE_S = 120.0  # for a loaded machine; a healthy run takes a few seconds
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}


def instance_port_socket() -> socket.socket:
    """A socket bound to a loopback port an instance may use (SGLang 0.5.11 adds 10000 for gRPC, so
    the settings refuse ports above 55535, where many ephemeral ones are): below the kernel's
    ephemeral range, another if one is taken."""
    rng = random.Random()
    for _ in range(200):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", rng.randrange(20000, 32768)))
            return s
        except OSError:
            s.close()
    pytest.fail("no free loopback port between 20000 and 32767")


class TrickleServer:
    """Takes connections and answers each so slowly that it never finishes: a status line, then a
    header line a second. `connected` is set at the first connection."""

    def __init__(self):
        self.sock = instance_port_socket()
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            self.connected.set()
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn):
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not self.stop.wait(1.0):
                conn.sendall(b"X-Still-Thinking: yes\r\n")
        except OSError:
            pass  # the client went away: that is what the test wants
        # stopped: the connection stays open and silent until close()

    def close(self):
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def trickle():
    server = TrickleServer()
    yield server
    server.close()


def as_from_a_terminal() -> None:
    """The command starts with SIGINT's default disposition, as from an interactive shell (where a
    Ctrl-C comes from). A test run started in the background of a non-interactive shell inherits
    SIGINT ignored, and Python then keeps it ignored (nohup's meaning): the tests would otherwise
    depend on how pytest itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + (
        [environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    return subprocess.Popen([sys.executable, "-m", "dflashctl", *argv], cwd=cwd, env={**environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)


def wait_for(what: str, ready, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"not {what} within {DEADLINE_S:g} s")
        time.sleep(0.05)


def interrupt(proc: subprocess.Popen, signame: str, server: "TrickleServer | None" = None) -> tuple[str, str]:
    proc.send_signal(SIGNALS[signame])
    if server is not None:  # silent from now on: the command's own HTTP timeout ends its reading thread
        server.stop.set()
    try:
        return proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running {DEADLINE_S:g} s after {signame}:\n{err}")


def check_interrupted(proc: subprocess.Popen, out: str, err: str, command: str, signame: str) -> None:
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in out + err, err
    obj = json.loads(out)  # exactly one object: json.loads refuses anything after it
    assert obj["ok"] is False, obj
    assert obj["error"]["exit_code"] == 130 and obj["error"]["what"] == "interrupted", obj
    assert signame in obj["error"]["why"] and obj["error"]["fix"], obj
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert f"dflashctl {command}: interrupted: by {signame}" in err, err
    assert lines[-1].startswith("  fix: run `dflashctl ") and "again" in lines[-1], err


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie nobody has reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


# --- status: held in its HTTP request to the instance ------------------------------------------------

@pytest.mark.parametrize("signame", SIGNALS)
def test_status_json_stopped_mid_sample_prints_the_interruption(tmp_path, trickle, signame):
    settings = tmp_path / "a.json"
    settings.write_text(json.dumps({"name": "a", "model": "m", "port": trickle.port, "gpus": [0]}))
    proc = start(["status", "--instance", settings, "--no-router", "--no-systemd", "--json"], tmp_path)
    wait_for("status asked the instance", trickle.connected.is_set, proc)
    out, err = interrupt(proc, signame, trickle)
    check_interrupted(proc, out, err, "status", signame)


# --- lock: held while uv resolves against an index that never finishes answering ---------------------

@pytest.mark.parametrize("signame", SIGNALS)
def test_lock_json_stopped_while_uv_resolves_prints_the_interruption_and_stops_uv(tmp_path, trickle, signame):
    pytest.importorskip("uv", reason="`dflashctl lock` needs uv (pip install -e './python[lock]')")
    spec = shutil.copy(REPO / "nix" / "stack.toml", tmp_path / "stack.toml")
    out_lock = tmp_path / "python-lock.json"
    index = f"http://127.0.0.1:{trickle.port}/simple"
    proc = start(["lock", "--spec", spec, "--lock", out_lock, "--json"], tmp_path,
                 env={"UV_DEFAULT_INDEX": index, "UV_INDEX_URL": index, "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
                      "UV_NO_CONFIG": "1", "UV_OFFLINE": "0", "TMPDIR": str(tmp_path)})
    wait_for("uv asked the index", trickle.connected.is_set, proc)
    uv_pids = children(proc.pid)
    out, err = interrupt(proc, signame, trickle)
    check_interrupted(proc, out, err, "lock", signame)
    assert not out_lock.exists()
    assert all(gone(p) for p in uv_pids), uv_pids
    assert not list(tmp_path.glob("dflash-lock-*"))  # uv's throw-away project is removed


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# --- doctor: held in its probes, in an interpreter that sleeps ---------------------------------------

@pytest.mark.parametrize("signame", SIGNALS)
def test_doctor_json_stopped_mid_probe_prints_the_interruption_and_kills_its_probes(tmp_path, signame):
    pids = tmp_path / "pids"
    pids.mkdir()
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho $$ > {pids}/$$\nexec sleep 600\n")
    python.chmod(0o755)
    proc = start(["doctor", "--python", python, "--json", "--timeout", "600"], tmp_path)
    wait_for("a probe started", lambda: any(pids.iterdir()), proc)
    out, err = interrupt(proc, signame)
    check_interrupted(proc, out, err, "doctor", signame)
    started = [int(p.name) for p in pids.iterdir()]
    deadline = time.monotonic() + DEADLINE_S  # SIGKILL is sent; the kernel takes its moment
    while not all(gone(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in started), f"probes left running: {[p for p in started if not gone(p)]}"


# --- without --json: the paragraph alone ----------------------------------------------------------

def test_without_json_the_interruption_is_one_paragraph_and_stdout_stays_empty(tmp_path, trickle):
    settings = tmp_path / "a.json"
    settings.write_text(json.dumps({"name": "a", "model": "m", "port": trickle.port, "gpus": [0]}))
    proc = start(["status", "--instance", settings, "--no-router", "--no-systemd"], tmp_path)
    wait_for("status asked the instance", trickle.connected.is_set, proc)
    out, err = interrupt(proc, "SIGTERM", trickle)
    assert proc.returncode == 130 and out == "" and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("  fix: run `dflashctl status` again")


def test_a_status_watch_ends_on_sigterm_as_on_ctrl_c(tmp_path):
    """--watch runs until stopped: SIGTERM ends it as Ctrl-C does, the last report standing (no error)."""
    closed = instance_port_socket()  # bound, never listening: its port refuses connections while held
    settings = tmp_path / "a.json"
    settings.write_text(json.dumps({"name": "a", "model": "m", "port": closed.getsockname()[1], "gpus": [0]}))
    proc = start(["status", "--instance", settings, "--no-router", "--no-systemd", "--json", "--watch", "0.2"],
                 tmp_path)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    wait_for("a first report", lambda: lines, proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=DEADLINE_S)
    reader.join(timeout=DEADLINE_S)
    closed.close()
    assert proc.returncode == 1, proc.stderr.read()  # the instance does not answer: unhealthy, not interrupted
    assert all(json.loads(ln)["exit_code"] == 1 for ln in lines if ln.strip())
