"""How a rollout restarts an instance and learns how the restart went: systemd, or a command.

systemd (the default): `systemctl restart --no-block dflash-<name>.service`, then the unit's own
view, polled with `systemctl show`: a Type=notify unit is `active` only once `dflashctl serve` sent
READY=1 (after a real decode), and a start that failed shows its exit status and the StatusText
serve left (the preflight's failures with their fixes). Whether an instance runs its unit's current
definition: each renderer (`dflashctl unit`, the NixOS module) puts DFLASH_UNIT_DIGEST, a digest of
everything the unit file says (unit.definition_digest; on NixOS also what NixOS itself writes into
it: PATH, systemd.globalEnvironment), into its Environment=, so the running process carries the
digest of the definition it was started from (/proc/<MainPID>/environ) and the unit the current one.

A command (`--restart-command`, hosts without systemd): run with {name} and {unit} filled in; it
restarts the instance and returns once the old process has stopped (supervisorctl restart, docker
restart and `systemctl restart` do), with a non-zero status if the restart failed. Readiness is then
the instance's own /health_generate. Nothing tells whether an instance is out of date there.
The command runs in its own session (its own process group) with its output going to a file, not a
pipe: a child it leaves holding stdout (a `sleep`, a server started with `&`) can neither delay
the rollout nor hang it. It ends when its own process exits, whatever its children still do; at its
deadline, or when the rollout is told to stop, its whole process group is sent SIGTERM, then
SIGKILL after KILL_GRACE_S, and the rollout goes on with rc 124 (130) and the end of its output.
"""

import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import CONFIG, DflashError
from dflashctl.service.unit_text import unit_data

DIGEST_VAR = unit_data()["digest"]["variable"]
_DIGEST_RE = re.compile(r"(?:^|\s)" + DIGEST_VAR + r"=([0-9a-f]+)")
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode",
              "StatusText", "InvocationID", "NRestarts", "MainPID", "NeedDaemonReload", "Environment",
              "ActiveEnterTimestamp", "StateChangeTimestamp", "StateChangeTimestampMonotonic")
CLD_EXITED = "1"  # ExecMainCode: the process exited (rather than being killed by a signal)


@dataclass(frozen=True)
class UnitState:
    load: str
    active: str  # ActiveState: active, activating, deactivating, failed, inactive
    sub: str  # SubState: running, start, auto-restart, dead, ...
    result: str
    exit_status: int | None  # of the last main process, when it exited
    status_text: str
    invocation: str
    restarts: int
    main_pid: int
    need_reload: bool
    digest: str | None  # DFLASH_UNIT_DIGEST of the unit's current definition
    active_since: str = ""  # ActiveEnterTimestamp, as systemd writes it
    state_since: str = ""  # StateChangeTimestamp: when the unit entered its current state
    state_since_monotonic_us: int | None = None  # the same on CLOCK_MONOTONIC (None: never)

    @property
    def ready(self) -> bool:
        return self.active == "active" and self.sub == "running"

    @property
    def start_failed(self) -> bool:
        return self.active == "failed" or self.sub == "auto-restart"


def _digest_of(environment: str) -> str | None:
    m = _DIGEST_RE.search(environment)
    return m.group(1) if m else None


class Systemd:
    def __init__(self, systemctl: str = "systemctl"):
        self.systemctl = systemctl

    def _run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.systemctl, *args], capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise DflashError("systemctl is not available on this host", f"{self.systemctl} not found",
                              "run the rollout on the host that runs the units, or pass --restart-command "
                              "for a host without systemd", CONFIG) from None
        except subprocess.TimeoutExpired:
            raise DflashError(f"`systemctl {' '.join(args)}` did not answer in {timeout:.0f} s",
                              "systemd is busy or hung", "try again; `systemctl list-jobs` shows what waits") from None

    def show(self, unit: str) -> UnitState:
        r = self._run("show", "-p", ",".join(PROPERTIES), unit)
        if r.returncode != 0:
            raise DflashError(f"cannot read the state of {unit}", (r.stderr or r.stdout).strip(),
                              "check that systemd runs on this host (`systemctl is-system-running`)")
        p = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        exited = p.get("ExecMainCode") == CLD_EXITED
        return UnitState(
            load=p.get("LoadState", ""), active=p.get("ActiveState", ""), sub=p.get("SubState", ""),
            result=p.get("Result", ""),
            exit_status=int(p["ExecMainStatus"]) if exited and p.get("ExecMainStatus", "").isdigit() else None,
            status_text=p.get("StatusText", ""), invocation=p.get("InvocationID", ""),
            restarts=int(p.get("NRestarts") or 0), main_pid=int(p.get("MainPID") or 0),
            need_reload=p.get("NeedDaemonReload") == "yes", digest=_digest_of(p.get("Environment", "")),
            active_since=p.get("ActiveEnterTimestamp", ""), state_since=p.get("StateChangeTimestamp", ""),
            state_since_monotonic_us=int(p["StateChangeTimestampMonotonic"])
            if p.get("StateChangeTimestampMonotonic", "0").isdigit() and int(p["StateChangeTimestampMonotonic"])
            else None)

    def running_digest(self, state: UnitState) -> str | None:
        """The digest the running main process was started with (root reads any /proc/PID/environ)."""
        if not state.main_pid:
            return None
        try:
            with open(f"/proc/{state.main_pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return None
        prefix = DIGEST_VAR.encode() + b"="
        found = next((e[len(prefix):] for e in env if e.startswith(prefix)), None)
        return found.decode() if found else None

    def restart(self, unit: str) -> None:
        r = self._run("restart", "--no-block", unit)
        if r.returncode != 0:
            raise DflashError(f"systemd refused to restart {unit}", (r.stderr or r.stdout).strip(),
                              f"see `systemctl status {unit}`")


TIMED_OUT = 124  # as coreutils' timeout(1): the command ran past its deadline
STOPPED = 130  # 128 + SIGINT: the rollout was told to stop while the command ran
KILL_GRACE_S = 5.0  # SIGTERM to the group, then SIGKILL to what is left after this long
PROGRESS_EVERY_S = 5.0
TAIL_LINES = 15
TAIL_BYTES = 64 * 1024  # the end of the output is read from here on: a chatty child cannot cost memory


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out: they hold nothing) of process group `pgid`, from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(entry.name))
    return found


def end_group(pgid: int, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM to every process of the group, SIGKILL to those still there after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_members(pgid):
            return


def last_lines(f, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of what was written to the open file `f`."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - TAIL_BYTES))
    text = f.read().decode(errors="replace")
    if size > TAIL_BYTES:  # the first line read may be cut: drop it
        text = text.split("\n", 1)[-1]
    return "\n".join(text.strip().splitlines()[-lines:])


class Command:
    """`--restart-command`: `log_dir` keeps each instance's output as `restart-<name>.log` there (a server
    the command starts with `&` writes on into it; without one it is an unnamed temporary file);
    `progress(text)` gets a line every PROGRESS_EVERY_S while the command runs."""

    def __init__(self, template: str, log_dir: str | Path | None = None, progress=None):
        self.template, self.log_dir, self.progress = template, log_dir, progress
        try:
            shlex.split(template)
        except ValueError as e:
            raise DflashError("--restart-command is not a valid command line", str(e),
                              "quote it as for a shell, e.g. 'supervisorctl restart {name}'", CONFIG) from None
        if "{name}" not in template and "{unit}" not in template:
            raise DflashError("--restart-command names no instance", f"{template!r} has neither {{name}} nor {{unit}}",
                              "put {name} (or {unit}) where the instance goes, e.g. 'supervisorctl restart dflash-{name}'",
                              CONFIG)

    def argv(self, name: str, unit: str) -> list[str]:
        return [a.replace("{name}", name).replace("{unit}", unit) for a in shlex.split(self.template)]

    def log_path(self, name: str) -> Path | None:
        return Path(self.log_dir) / f"restart-{name}.log" if self.log_dir is not None else None

    def _output_file(self, name: str):
        path = self.log_path(name)
        if path is not None:
            try:
                return open(path, "w+b"), path
            except OSError:  # the directory is not there or not ours: the output still has to go somewhere
                pass
        return tempfile.TemporaryFile(prefix=f"dflash-restart-{name}-"), None

    def restart(self, name: str, unit: str, timeout: float, give_up=lambda: False, *, progress=None,
                progress_every: float = PROGRESS_EVERY_S, kill_grace: float = KILL_GRACE_S) -> tuple[int, str]:
        """(exit status, the end of its output): its own status once its own process exited (children it
        left keep running); 124 when it ran past `timeout` seconds, 130 when `give_up()` turned true
        first: in both its whole process group is ended (SIGTERM, then SIGKILL after `kill_grace`)."""
        progress = progress or self.progress or (lambda text: None)
        argv = self.argv(name, unit)
        out, path = self._output_file(name)
        with out:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            except FileNotFoundError:
                return 127, f"{argv[0]}: command not found"
            except PermissionError:
                return 126, f"{argv[0]}: permission denied (not executable)"
            where = f" (its whole output: {path})" if path else ""
            t0 = last_said = time.monotonic()
            while True:
                try:
                    rc = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                elapsed = time.monotonic() - t0
                stop, late = give_up(), elapsed >= timeout
                if stop or late:
                    end_group(proc.pid, kill_grace)
                    proc.wait()
                    tail = last_lines(out)
                    why = ("stopped: the rollout was told to stop" if stop
                           else f"still running after {timeout:.0f} s")
                    return (STOPPED if stop else TIMED_OUT), \
                        f"{why}; its process group was ended{where}" + (f"; its last output:\n{tail}" if tail else "")
                if time.monotonic() - last_said >= progress_every:
                    last_said = time.monotonic()
                    line = last_lines(out, 1)
                    progress(f"{name}: the restart command has run {elapsed:.0f} s"
                             + (f"; its last output: {line}" if line else "; no output yet"))
            left = group_members(proc.pid)
            if left:
                progress(f"{name}: the restart command exited {rc} and left {len(left)} process(es) running in "
                         f"its group (pids {', '.join(map(str, left))}){where}")
            return rc, last_lines(out)
