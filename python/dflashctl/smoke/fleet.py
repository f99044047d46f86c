"""The servers smoke starts, and watching them while they start and while they are measured.

Several servers may share one GPU (`launch together`), so waiting and watching cover all of them:
the first that dies ends everything within a second. Each starts through serve's own path:
settings.instance_settings -> config.from_dict -> sglang_args.build_argv and child_env ->
server.Server.
"""

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl.errors import SERVER_DIED_AFTER_READY, SERVER_DIED_BEFORE_READY, DflashError
from dflashctl.service import config, sglang_args
from dflashctl.service.child_env import child_env
from dflashctl.service.server import Server
from dflashctl.smoke import sglang_0_5_11
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.ports import free_port
from dflashctl.smoke.settings import RunSpec, instance_settings

PORT_TRIES = 3  # starts of one server whose port another program took before the server bound it


@dataclass
class Started:
    run: str
    server: Server
    cfg: config.InstanceConfig
    startup_s: float | None = None
    launched: datetime.datetime | None = None  # local time, as SGLang stamps its log
    rebuild: Callable[[], tuple[config.InstanceConfig, Server]] | None = None  # the same server on a fresh port
    port_retries: list[int] = field(default_factory=list)  # the ports lost to another program
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: bool = False

    def launch(self) -> None:
        self.launched = datetime.datetime.now()
        self.server.start()
        say(f"started {self.run} on {self.cfg.base_url} (pid {self.server.pid}, log {self.server.log_path})")

    def lost_its_port(self) -> bool:
        """Whether this start died only because its port was taken (the server's log says so)."""
        return bool(sglang_0_5_11.PORT_TAKEN.search(self.server.log_since_start()))

    def start_on_fresh_port(self) -> bool:
        """Start again on another port, after a start that lost its port; False once stopping."""
        with self._lock:
            if self._stopping or self.rebuild is None:
                return False
            lost = self.cfg.port
            self.server.stop(grace=15)  # what is left of its group
            self.cfg, self.server = self.rebuild()
            self.port_retries.append(lost)
            say(f"{self.run}: port {lost} was taken by another program before the server bound it; "
                f"starting it again on port {self.cfg.port}")
            self.launch()
            return True

    def stop(self, grace: float = 15) -> None:
        with self._lock:
            self._stopping = True
        self.server.stop(grace=grace)


def _server_for(o: SmokeOptions, spec: RunSpec, launch: str, work: Path,
                fraction: float | None) -> tuple[config.InstanceConfig, Server]:
    """One run's settings on a fresh port, and its server (not started): serve's own path."""
    d = instance_settings(o, spec, free_port(), launch, fraction)
    cfg = config.from_dict(d, d["name"], origin="smoke settings")
    env = child_env(cfg, o.python).env
    return cfg, Server(sglang_args.build_argv(cfg, python=o.python), env,
                       work / "logs" / f"{spec.run}.log", cfg.base_url)


def start_server(o: SmokeOptions, spec: RunSpec, launch: str, work: Path, started: list[Started],
                 fraction: float | None = None) -> Started:
    """Start one run's server (not waiting for it).

    It joins `started` before its process exists, so a SIGTERM at any moment still stops it."""
    cfg, srv = _server_for(o, spec, launch, work, fraction)
    s = Started(spec.run, srv, cfg, rebuild=lambda: _server_for(o, spec, launch, work, fraction))
    started.append(s)
    s.launch()
    return s


def _renamed(run: str, e: DflashError) -> DflashError:
    return DflashError(f"{run} server: {e.what}", e.why, e.fix, e.exit_code)


class Fleet:
    """Servers starting side by side: hands them out as each becomes ready, so one can be measured
    while the others still start, and `check()` raises as soon as any of them dies or times out."""

    def __init__(self, started: list[Started], timeout: float):
        self.started = started
        self._status = {s.run: (0.0, "") for s in started}
        self._errors: list[DflashError] = []
        self._ready: list[Started] = []  # in the order they became ready
        self._handed_out = 0
        self._lock = threading.Lock()
        for s in started:
            threading.Thread(target=self._wait, args=(s, timeout), daemon=True, name=f"wait-{s.run}").start()

    def _wait(self, s: Started, timeout: float) -> None:
        for attempt in range(1, PORT_TRIES + 1):
            try:
                # Log-only stall check: the servers share a GPU, so its memory says nothing of one of them.
                s.startup_s = s.server.wait_ready(
                    timeout, on_progress=lambda t, line: self._status.__setitem__(s.run, (t, line)),
                    stall_timeout=s.cfg.stall_timeout_sec)
                with self._lock:
                    self._ready.append(s)
                return
            except DflashError as e:
                retry = (e.exit_code == SERVER_DIED_BEFORE_READY and attempt < PORT_TRIES
                         and s.lost_its_port() and s.start_on_fresh_port())
                if not retry:
                    if e.exit_code == SERVER_DIED_BEFORE_READY and s.lost_its_port():
                        lost = ", ".join(map(str, s.port_retries + [s.cfg.port]))
                        e = DflashError(e.what, e.why, f"its port was taken by another program on each of "
                                        f"{attempt} starts (ports {lost}): find what binds them (ss -ltnp), "
                                        "or pass --url to test a running server", e.exit_code)
                    with self._lock:
                        self._errors.append(_renamed(s.run, e))
                    return

    def check(self) -> None:
        """Raise if a server died: before ready (wait_ready's error) or after (its exit status)."""
        with self._lock:
            if self._errors:
                raise self._errors[0]
            ready = list(self._ready)
        for s in ready:
            rc = s.server.poll()
            if rc is not None:
                raise DflashError(f"the {s.run} server exited with status {rc} while smoke requests ran",
                                  "its log ends with:\n" + "\n".join("    | " + line for line in
                                                                     s.server.log_tail().splitlines()),
                                  f"read the full log: {s.server.log_path}", SERVER_DIED_AFTER_READY)

    def next_ready(self) -> Started | None:
        """The next server that is ready (waiting for it, with progress on stderr); None when all
        have been handed out."""
        if self._handed_out == len(self.started):
            return None
        last = time.monotonic()
        while True:
            self.check()
            with self._lock:
                if len(self._ready) > self._handed_out:
                    s = self._ready[self._handed_out]
                    self._handed_out += 1
                    say(f"{s.run} ready after {s.startup_s:.1f}s")
                    return s
            time.sleep(0.1)
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                for s in self.started:
                    if s.startup_s is None:
                        t, line = self._status[s.run]
                        say(f"starting {s.run}: {t:.0f}s, log: {line[:150]}")


def stop_all(started: list[Started]) -> None:
    threads = [threading.Thread(target=s.stop, kwargs={"grace": 15}) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
