"""A small service manager for `dflashctl serve`, doing for the rollout tests what systemd does for the units.

There is no systemd outside the container tier, so the loopback tests and benchmarks run each
instance under this: `dflashctl serve --config FILE ...` (the real supervisor) with NOTIFY_SOCKET
pointed at a datagram socket of ours, so READY=1, STATUS= and the exit status are seen as systemd
sees them. After an exit an instance is started again RESTART_SEC later, unless its status is in
errors.NO_RESTART (the unit's RestartPreventExitStatus). `restart NAME` on the control socket
(tests/rollout_ctl.py, given to `dflashctl rollout --restart-command`) stops the instance (SIGTERM,
then SIGKILL after STOP_TIMEOUT_S) and starts it with its current definition, answering once it is
ready (READY=1, after serve's real decode) or its start failed, with serve's last STATUS=: what
`systemctl restart` does for a Type=notify unit. `restart_all()` is what a NixOS switch does today
with stopIfChanged: every instance stopped, then every one started.

Sockets are in the abstract namespace (no path length limit, nothing left on disk).
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl import errors

REPO = Path(__file__).resolve().parent.parent
CTL = REPO / "tests" / "rollout_ctl.py"
RESTART_SEC = 0.5
STOP_TIMEOUT_S = 45.0  # the unit's TimeoutStopSec
# The rollout's canary in the tests that roll stand-ins: 32 greedy tokens once, speed not judged (a
# stand-in's millisecond tokens on a loaded machine cannot decide a speed ratio: CI saw an unchanged
# build read at 0.54x); outputs, errors and acceptance are judged as by default. The speed judgement
# is tested between builds whose forward passes differ fourfold (test_canary_measure.py,
# test_rollout_faults.py).
QUICK_CANARY = ("--canary-tokens", "32", "--canary-repeats", "1", "--canary-expect", "speed")


@dataclass
class Definition:
    """What the unit would say: the command line and the environment of the next start."""
    argv: list[str]
    env: dict[str, str]


@dataclass
class Instance:
    name: str
    definition: Definition
    log: Path
    notify_address: str = field(default_factory=lambda: "@dflash-notify-" + uuid.uuid4().hex)
    proc: subprocess.Popen | None = None
    state: str = "stopped"  # starting | ready | auto-restart | failed | stopped
    status_text: str = ""
    exit_status: int | None = None
    starts: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, "start" | "ready" | "exit N")
    changed: threading.Condition = field(default_factory=threading.Condition)


class Supervisor:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.instances: dict[str, Instance] = {}
        self.control_address = "@dflash-rollout-ctl-" + uuid.uuid4().hex
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._control: socket.socket | None = None

    @property
    def restart_command(self) -> str:
        return f"{sys.executable} {CTL} {self.control_address} restart {{name}}"

    def add(self, name: str, argv: list[str], env: dict[str, str]) -> Instance:
        inst = Instance(name, Definition(list(argv), dict(env)), self.dir / f"serve-{name}.log")
        self.instances[name] = inst
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.bind("\0" + inst.notify_address[1:])
        self._spawn(self._listen, inst, sock)
        return inst

    def define(self, name: str, argv: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """A new definition for the next start (as an edited unit after daemon-reload)."""
        d = self.instances[name].definition
        self.instances[name].definition = Definition(argv if argv is not None else d.argv,
                                                     env if env is not None else d.env)

    # --- processes -------------------------------------------------------------------------------
    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _start(self, inst: Instance) -> None:
        env = {**inst.definition.env, "NOTIFY_SOCKET": inst.notify_address}
        with inst.changed:
            if self._stopping:  # a restart asked for before shutdown() must not start after it
                inst.state = "stopped"
                inst.changed.notify_all()
                return
            inst.state, inst.status_text, inst.exit_status = "starting", "", None
            inst.starts += 1
            inst.events.append((time.monotonic(), "start"))
            log = open(inst.log, "a")
            inst.proc = subprocess.Popen(inst.definition.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            log.close()
            inst.changed.notify_all()
        self._spawn(self._reap, inst, inst.proc)

    def _reap(self, inst: Instance, proc: subprocess.Popen) -> None:
        rc = proc.wait()
        with inst.changed:
            if inst.proc is not proc:
                return
            inst.exit_status = rc
            inst.events.append((time.monotonic(), f"exit {rc}"))
            stopped_by_us = inst.state == "stopping"
            if stopped_by_us or self._stopping:
                inst.state = "stopped"
            elif rc in errors.NO_RESTART:
                inst.state = "failed"
            else:
                inst.state = "auto-restart"
            inst.changed.notify_all()
        if inst.state == "auto-restart":
            time.sleep(RESTART_SEC)
            with inst.changed:
                again = inst.state == "auto-restart" and not self._stopping
            if again:
                self._start(inst)

    def _listen(self, inst: Instance, sock: socket.socket) -> None:
        while not self._stopping:
            try:
                data = sock.recv(4096).decode(errors="replace")
            except OSError:
                return
            with inst.changed:
                for line in data.splitlines():
                    if line == "READY=1" and inst.state == "starting":
                        inst.state = "ready"
                        inst.events.append((time.monotonic(), "ready"))
                    elif line.startswith("STATUS="):
                        inst.status_text = line[len("STATUS="):]
                inst.changed.notify_all()

    def _stop(self, inst: Instance) -> None:
        with inst.changed:
            proc = inst.proc
            if proc is None or proc.poll() is not None:
                inst.state = "stopped"
                return
            inst.state = "stopping"
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with inst.changed:
            inst.changed.wait_for(lambda: inst.state == "stopped", timeout=5)

    def wait_started(self, inst: Instance, timeout: float) -> tuple[bool, str]:
        """Until READY=1 (True) or a failed start (False, with serve's exit status and status)."""
        with inst.changed:
            inst.changed.wait_for(lambda: inst.state != "starting", timeout=timeout)
            if inst.state == "ready":
                return True, inst.status_text
            if inst.state == "starting":
                return False, f"not ready after {timeout:.0f} s: {inst.status_text}"
            return False, f"exit {inst.exit_status}: {inst.status_text}"

    def start_all(self, timeout: float = 120.0) -> None:
        for inst in self.instances.values():
            self._start(inst)
        for inst in self.instances.values():
            ok, text = self.wait_started(inst, timeout)
            if not ok:
                raise RuntimeError(f"{inst.name} did not start: {text}; log {inst.log}")

    def restart(self, name: str, timeout: float = 120.0) -> tuple[bool, str]:
        inst = self.instances[name]
        self._stop(inst)
        self._start(inst)
        return self.wait_started(inst, timeout)

    def restart_all(self, timeout: float = 120.0) -> list[tuple[bool, str]]:
        for inst in self.instances.values():
            self._stop(inst)
        for inst in self.instances.values():
            self._start(inst)
        return [self.wait_started(inst, timeout) for inst in self.instances.values()]

    # --- control socket ------------------------------------------------------------------------
    def serve_control(self) -> "Supervisor":
        self._control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._control.bind("\0" + self.control_address[1:])
        self._control.listen(8)
        self._spawn(self._accept)
        return self

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._control.accept()
            except OSError:
                return
            self._spawn(self._answer, conn)

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            words = conn.makefile().readline().split()
            if len(words) != 2 or words[0] != "restart" or words[1] not in self.instances:
                conn.sendall(f"failed: unknown request {' '.join(words)!r}\n".encode())
                return
            ok, text = self.restart(words[1])
            try:
                conn.sendall(f"{'ok' if ok else 'failed'}: {text}\n".encode())
            except OSError:
                pass  # the asker gave up waiting (its own timeout): the restart went on regardless

    def shutdown(self) -> None:
        for inst in self.instances.values():
            with inst.changed:  # under each lock: a _start() either ran before (and is stopped) or sees it
                self._stopping = True
        self._stopping = True
        for inst in self.instances.values():
            self._stop(inst)
        if self._control is not None:
            self._control.close()


def kill_groups(pgids) -> None:
    """SIGKILL each process group a failing test left behind (a restart command's), never our own:
    a command that did not get a group of its own shares the test's."""
    for pgid in pgids:
        if pgid == os.getpgrp():
            continue
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve_argv(settings: Path, standin: Path, python: str | None = None, preflight: bool = False) -> list[str]:
    """`dflashctl serve` for one instance, the stand-in SGLang as its launcher."""
    argv = [sys.executable, "-m", "dflashctl", "serve", "--config", str(settings),
            "--launcher", f"{sys.executable} {standin}"]
    if python:
        argv += ["--python", python]
    return argv + ([] if preflight else ["--skip-preflight"])


class Rotation:
    """The router's healthy workers, read every 0.1 s beside a rollout (not the rollout's own count):
    every sample, the least seen, and how long none was healthy. `with Rotation(router) as r:`."""

    def __init__(self, router):
        self.router, self.samples, self.none_s = router, [], 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def least(self) -> int | None:
        return min(self.samples) if self.samples else None

    def _run(self):
        last = time.monotonic()
        while not self._stop.is_set():
            seen = self.router.workers()
            now = time.monotonic()
            if seen:
                healthy = sum(seen.values())
                self.samples.append(healthy)
                if healthy == 0:
                    self.none_s += now - last
            last = now
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

