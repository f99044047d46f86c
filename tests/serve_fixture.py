"""The `serve` fixture: `dflashctl serve` as a real process, with a real NOTIFY_SOCKET (Notify) and
the stand-in SGLang child (tests/data/service/standin_server.py). Registered in conftest.py, so
every test module can ask for `serve`."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from dflashctl.service import config
from dflashctl.smoke import ports

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"
LAUNCHER = f"{sys.executable} {STANDIN}"
NEVER = 60  # a bound no test should reach: serve must not wait out a timeout for a dead child


def free_port() -> int:
    """A free port the settings accept (<= config.MAX_PORT: SGLang derives its gRPC port + 10000),
    outside the ephemeral range as the smoke chooses them."""
    return ports.free_port(config.MAX_PORT)


class Notify:
    """A datagram socket playing systemd's notify socket."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def recv_until(self, wanted: str, proc: subprocess.Popen, timeout: float = NEVER) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.sock.settimeout(0.2)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                if proc.poll() is not None:
                    self.drain()
                    return any(wanted in m for m in self.messages)
                continue
            if wanted in self.messages[-1]:
                return True
        return False

    def drain(self) -> None:
        self.sock.settimeout(0)
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        except (BlockingIOError, socket.timeout):
            pass


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(mode: str, args=(), settings: dict | None = None, env=None, environment: dict | None = None,
              **standin):
        port = free_port()
        ok_file = tmp_path / "ok"
        cfg = {"name": "t", "model": "stand-in", "port": port, "gpus": [0], "startTimeoutSec": 600,
               "environment": {"STANDIN_MODE": mode, "STANDIN_OK_FILE": str(ok_file),
                               "STANDIN_ARGV_FILE": str(tmp_path / "argv.json"),
                               **{f"STANDIN_{k.upper()}": str(v) for k, v in standin.items()},
                               **(environment or {})},
               **(settings or {})}
        f = tmp_path / "settings.json"
        f.write_text(json.dumps(cfg))
        notify = Notify(tmp_path / "notify.sock")
        child_env = dict(os.environ, NOTIFY_SOCKET=str(notify.path),
                         PYTHONPATH=str(REPO / "python"), **(env or {}))
        proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "serve", "--config", str(f),
                                 "--log-file", str(tmp_path / "sglang.log"), "--launcher", LAUNCHER,
                                 *args], env=child_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        proc.ok_file, proc.notify, proc.tmp = ok_file, notify, tmp_path
        return proc

    yield start
    for p in procs:
        stop_serve(p)


def descendants(pid: int) -> list[int]:
    """The process's children, theirs, and so on (from /proc), at this moment."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        return found
    return found + [d for c in found for d in descendants(c)]


def stop_serve(p: subprocess.Popen, grace: float = 30) -> None:
    """Stop a serve still running as systemd does: SIGTERM to its group (serve stops SGLang, which
    runs in a group of its own), SIGKILL after `grace` s; then SIGKILL to whatever serve had started
    and left (a SIGKILLed serve leaves its SGLang running, reparented away from the test)."""
    if p.poll() is not None:
        return
    left = []
    for pid in descendants(p.pid):
        try:
            left.append(os.pidfd_open(pid))  # a handle: the pid may be reused once it is gone
        except OSError:
            pass
    try:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            os.killpg(p.pid, sig)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for fd in left:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        for fd in left:
            os.close(fd)


FREEZER = Path("/sys/fs/cgroup/freezer")  # cgroup v1's freezer hierarchy


@contextmanager
def frozen(*pids: int):
    """The processes `pids` frozen (cgroup v1 freezer) for the block: they cannot run, so a SIGKILL stays
    pending and they do not exit, as a process stuck in the GPU driver (state D). Thawed after the
    block, when a pending SIGKILL ends them. Skips the test where the v1 freezer is not writable
    (hosts with cgroup v2 alone, whose freezer lets SIGKILL through)."""
    group = FREEZER / f"dflash-test-{os.getpid()}-{pids[0]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"needs the cgroup v1 freezer writable at {FREEZER} to make a process that outlives "
                    f"SIGKILL ({e.strerror})")
    try:
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            time.sleep(0.01)
        yield
    finally:
        (group / "freezer.state").write_text("THAWED")
        for task in (group / "cgroup.procs").read_text().split():
            try:
                (FREEZER / "cgroup.procs").write_text(task)  # alive still: back to the root group
            except OSError:
                pass  # it exited meanwhile
        for _ in range(100):  # an exiting task can hold the group a moment
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)
