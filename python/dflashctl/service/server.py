"""The SGLang child process: start it in its own process group, know at once when it dies.

Readiness is a real decode, never an open port: `/health_generate` answers 200, or, sooner, SGLang
logged that its own warm-up is done and one token of ours came back from `/generate`
(service/sglang_0_5_11.py says why the first costs a second more). The child is watched while a
request is in flight, so a crash is reported within a fraction of a second instead of after a
timeout. Shared by `dflashctl serve` and `dflashctl smoke`.
"""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from dflashctl import stop_signals
from dflashctl.errors import SERVER_DIED_BEFORE_READY, SERVER_STALLED, SERVER_START_TIMEOUT, DflashError
from dflashctl.service import listen_check
from dflashctl.service.sglang_0_5_11 import READY_DECODE, WARMED_UP_LINE
from dflashctl.service.stall import GpuMemory, StallWatch

POLL_S = 0.1  # how often the child is checked while waiting
KILL_WAIT_S = 10.0  # after SIGKILL: a process stuck in the driver (a lost GPU) may never exit; do not hang with it
HEALTH_INTERVAL_S = 0.5  # pause between health attempts
HEALTH_REQUEST_TIMEOUT_S = 60.0  # one /health_generate may include the first CUDA-graph decode
PORT_LOST_GRACE_S = 5.0  # SIGTERM to SIGKILL once SGLang lost its port: it serves nothing to drain


class Server:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, base_url: str,
                 api_key: str | None = None, echo: TextIO | None = None, listen: tuple[str, int] | None = None):
        self.argv, self.env, self.log_path = list(argv), dict(env), Path(log_path)
        self.base_url, self.api_key, self.echo = base_url.rstrip("/"), api_key, echo
        self.listen = listen  # SGLang's (host, port): who else listens there is asked (listen_check)
        self.proc: subprocess.Popen | None = None
        self._echo_thread: threading.Thread | None = None
        self._log_offset = 0
        self.ready_by = ""  # what proved readiness, for the log
        self.stuck = False  # a stop's SIGKILL did not end it (see stop)

    # --- process ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()  # echo starts here: earlier runs' lines are not repeated
            try:
                with stop_signals.deferred():  # a stop arriving now is handled once self.proc is set
                    self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                                 stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)  # own group: signals reach all
            except OSError as e:
                raise DflashError(f"cannot start {self.argv[0]}", e.strerror or str(e),
                                  "check the stack's Python interpreter path", SERVER_DIED_BEFORE_READY)
        if self.echo is not None:
            self._echo_thread = threading.Thread(target=self._follow_log, daemon=True)
            self._echo_thread.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None if the child still runs after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def stop(self, grace: float = 30) -> int | None:
        """SIGTERM to the process group, SIGKILL to what is left after `grace` seconds.

        None: it did not die (uninterruptible in the driver); `stuck` then says so, and a later stop
        sends SIGKILL again without waiting again: serve's own stop must end before systemd's
        TimeoutStopSec, and waiting twice for a process that cannot run would not."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and not self.stuck:
            self.signal_group(signal.SIGTERM)
            if self.wait(grace) is None:
                self.signal_group(signal.SIGKILL)
                self.stuck = self.wait(KILL_WAIT_S) is None
        self.signal_group(signal.SIGKILL)  # helpers the leader left behind (scheduler, detokenizer)
        return self.proc.poll()

    # --- readiness -------------------------------------------------------------------------------
    def wait_ready(self, timeout: float, on_progress: Callable[[float, str], None] | None = None,
                   health_path: str = "/health_generate", stall_timeout: float = 0,
                   gpu: GpuMemory | None = None,
                   abort: Callable[[], DflashError | None] | None = None) -> float:
        """Block until `health_path` answers 200, or SGLang logged its warm-up done and a one-token
        /generate answered 200 (whichever comes first; `ready_by` says which); returns the seconds it took.

        Raises SERVER_DIED_BEFORE_READY as soon as the child exits (checked every POLL_S, also while
        a health request hangs), SERVER_STALLED after `stall_timeout` seconds (0: never) without
        new log output or a change in `gpu`'s memory, and SERVER_START_TIMEOUT after `timeout` seconds.
        `abort`, asked every POLL_S, returns the error to stop with (serve's GPU watch), or None.
        """
        start = time.monotonic()
        watch = StallWatch(stall_timeout, self.log_path, self._log_offset, gpu,
                           look_for=(WARMED_UP_LINE, listen_check.PORT_LOST_MARK))
        port_asked = False
        health = _Attempts(lambda result, limit: self._request(health_path, result, limit))
        decode = _Attempts(lambda result, limit: self._request("/generate", result, limit, READY_DECODE))
        last_progress = start
        while True:
            now = time.monotonic()
            rc = self.proc.poll()
            if rc is not None:
                raise self._died_before_ready(rc, now - start, watch)
            stop = abort() if abort is not None else None
            if stop is not None:
                raise stop
            if listen_check.PORT_LOST_MARK in watch.found and not port_asked:
                port_asked = True  # once: the mark may be another port's (NCCL's), and a scan costs
                if err := self._port_lost():
                    raise err
            limit = max(1.0, min(HEALTH_REQUEST_TIMEOUT_S, start + timeout - now))
            if health.answered(now, limit):
                self.ready_by = f"{self.base_url}{health_path} decoded a token"
                return self._ours_answered(now - start)
            if WARMED_UP_LINE in watch.found and decode.answered(now, limit):
                self.ready_by = f"SGLang logged its warm-up done and {self.base_url}/generate decoded a token"
                return self._ours_answered(now - start)
            if watch.stalled():
                raise DflashError(f"SGLang made no start-up progress for {stall_timeout:.0f} s "
                                  f"({watch.watching()}), {now - start:.0f} s after start; stopping it",
                                  f"the last thing it logged: {watch.last_line or '(nothing)'}\n"
                                  "its log ends with:\n" + _indent(self.log_tail()),
                                  "find what that step waits on (a download, a file lock, NCCL between "
                                  "GPUs, a compiler); if it is only slow, raise stallTimeoutSec (0 turns "
                                  f"the check off). Full log: {self.log_path}", SERVER_STALLED)
            if now - start >= timeout:
                raise DflashError(f"SGLang was not ready after {timeout:.0f} s",
                                  f"{health_path} never answered 200 while the process kept running; "
                                  "its log ends with:\n" + _indent(self.log_tail()),
                                  "if the model is still loading, raise startTimeoutSec; otherwise "
                                  f"read {self.log_path}", SERVER_START_TIMEOUT)
            if on_progress is not None and now - last_progress >= 1.0:
                last_progress = now
                on_progress(now - start, self.last_log_line())
            time.sleep(POLL_S)

    def _died_before_ready(self, rc: int, after: float, watch: StallWatch) -> DflashError:
        watch.read()  # its last lines: a bind that failed explains the death
        if listen_check.PORT_LOST_MARK in watch.found and (err := self._port_lost()):
            return err
        return DflashError(f"SGLang exited with status {_describe(rc)} before it was ready ({after:.1f} s after "
                           "start)", "its log ends with:\n" + _indent(self.log_tail()),
                           f"read the log above (full log: {self.log_path})", SERVER_DIED_BEFORE_READY)

    def _port_lost(self) -> DflashError | None:
        """SGLang logged a failed bind: when another program holds its host:port, stop SGLang (it
        would wait minutes for its own warm-up, asking that program) and name the holder. None when
        the port is free or SGLang's own listener holds it: the failed bind was another port's."""
        if self.listen is None:
            return None
        host, port = self.listen
        found = listen_check.foreign(host, port, self.pid)
        problem = listen_check.bind_problem(host, port)
        if not found and (problem is None or listen_check.listening_sockets(port, host=host)):
            return None
        return self._stop_naming(found, problem, "it was free when serve started; SGLang loaded the model, then "
                                 f"could not listen, and was stopped. Its log ends with:\n{_indent(self.log_tail(12))}")

    def _ours_answered(self, took: float) -> float:
        """Ready, unless another program listens on SGLang's host:port: then it may be what answered
        (SGLang's own bind failed, or is yet to come); SGLang is stopped and the holder named."""
        if self.listen is None:
            return took
        host, port = self.listen
        found = listen_check.foreign(host, port, self.pid)
        if not found:
            return took
        raise self._stop_naming(found, listen_check.bind_problem(host, port),
                                f"the readiness requests to {self.base_url} may have been answered by it, "
                                "not by this instance's SGLang, which was stopped")

    def _stop_naming(self, found: list, problem: OSError | None, consequence: str) -> DflashError:
        self.stop(PORT_LOST_GRACE_S)
        host, port = self.listen
        return listen_check.taken_error(host, port, problem, consequence, found)

    def _request(self, path: str, result: dict, timeout: float, body: dict | None = None) -> None:
        """GET `path`, or POST `body` as JSON to it; result["ok"] on a 200."""
        req = urllib.request.Request(self.base_url + path)
        if body is not None:
            req.data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        self._answer(req, result, timeout)

    @staticmethod
    def _answer(req: urllib.request.Request, result: dict, timeout: float) -> None:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                result["ok"] = resp.status == 200
        except (OSError, urllib.error.URLError, ValueError):
            result["ok"] = False  # not listening yet, 503 while loading, or a reset

    # --- log -------------------------------------------------------------------------------------
    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                data = f.read()
        except OSError:
            return "(no log)"
        text = data.decode("utf-8", "replace").rstrip("\n")
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"

    def log_since_start(self, limit: int = 256 * 1024) -> str:
        """What this start wrote to the log (not earlier runs appended to the same file), its last
        `limit` bytes."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(self._log_offset, f.tell() - limit))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def last_log_line(self) -> str:
        tail = self.log_tail(5).splitlines()
        return tail[-1].strip() if tail else ""

    def _follow_log(self) -> None:
        """Copy the child's log to `echo` (the journal, under systemd) as it grows."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            while True:
                chunk = f.read(65536)
                if chunk:
                    self.echo.write(chunk.decode("utf-8", "replace"))
                    self.echo.flush()
                elif self.proc.poll() is not None:
                    rest = f.read()  # what it wrote just before exiting
                    self.echo.write(rest.decode("utf-8", "replace"))
                    self.echo.flush()
                    return
                else:
                    time.sleep(0.2)


class _Attempts:
    """One readiness request at a time, in a thread (the caller keeps watching the child), the next
    HEALTH_INTERVAL_S after one that failed."""

    def __init__(self, send: Callable[[dict, float], None]):
        self.send, self.attempt, self.next_at = send, {}, 0.0

    def answered(self, now: float, limit: float) -> bool:
        if self.attempt and not self.attempt["thread"].is_alive():
            if self.attempt["ok"]:
                return True
            self.attempt, self.next_at = {}, now + HEALTH_INTERVAL_S
        if not self.attempt and now >= self.next_at:
            self.attempt = {"ok": False}
            self.attempt["thread"] = threading.Thread(target=self.send, args=(self.attempt, limit), daemon=True)
            self.attempt["thread"].start()
        return False


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"{rc} (killed by {signal.Signals(-rc).name})"
        except ValueError:
            return str(rc)
    return str(rc)


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.splitlines())
