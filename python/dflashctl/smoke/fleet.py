"""The servers smoke starts, and watching them while they start and while they are measured.

Several servers may share one GPU (`launch together`), so waiting and watching cover all of them:
the first that dies ends everything within a second. Each starts through serve's own path:
settings.instance_settings -> config.from_dict -> sglang_args.build_argv and child_env ->
server.Server.
"""

import datetime
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import SERVER_DIED_AFTER_READY, DflashError
from dflashctl.service import config, sglang_args
from dflashctl.service.child_env import child_env
from dflashctl.service.server import Server
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.ports import free_port
from dflashctl.smoke.settings import RunSpec, instance_settings


@dataclass
class Started:
    run: str
    server: Server
    cfg: config.InstanceConfig
    startup_s: float | None = None
    launched: datetime.datetime | None = None  # local time, as SGLang stamps its log


def start_server(o: SmokeOptions, spec: RunSpec, launch: str, work: Path, started: list[Started],
                 fraction: float | None = None) -> Started:
    """Start one run's server (not waiting for it).

    It joins `started` before its process exists, so a SIGTERM at any moment still stops it."""
    d = instance_settings(o, spec, free_port(), launch, fraction)
    cfg = config.from_dict(d, d["name"], origin="smoke settings")
    env = child_env(cfg, o.python).env
    srv = Server(sglang_args.build_argv(cfg, python=o.python), env,
                 work / "logs" / f"{spec.run}.log", cfg.base_url)
    s = Started(spec.run, srv, cfg)
    started.append(s)
    s.launched = datetime.datetime.now()
    srv.start()
    say(f"started {spec.run} on {cfg.base_url} (pid {srv.pid}, log {srv.log_path})")
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
        try:
            # Log-only stall check: the servers share a GPU, so its memory says nothing of one of them.
            s.startup_s = s.server.wait_ready(
                timeout, on_progress=lambda t, line: self._status.__setitem__(s.run, (t, line)),
                stall_timeout=s.cfg.stall_timeout_sec)
            with self._lock:
                self._ready.append(s)
        except DflashError as e:
            with self._lock:
                self._errors.append(_renamed(s.run, e))

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
    threads = [threading.Thread(target=s.server.stop, kwargs={"grace": 15}) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
