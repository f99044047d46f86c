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
"""

import re
import shlex
import subprocess
import time
from dataclasses import dataclass

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


class Command:
    def __init__(self, template: str):
        self.template = template
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

    def restart(self, name: str, unit: str, timeout: float, give_up=lambda: False) -> tuple[int, str]:
        """(exit status, the end of its output); 124 when it ran past `timeout`, 130 when `give_up()`
        turned true first (the command is then left to finish on its own)."""
        argv = self.argv(name, unit)
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except FileNotFoundError:
            return 127, f"{argv[0]}: command not found"
        deadline = time.monotonic() + timeout
        while True:
            try:
                out, _ = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if give_up():
                    return 130, "interrupted while it ran"
                if time.monotonic() >= deadline:
                    proc.kill()
                    proc.communicate()
                    return 124, f"still running after {timeout:.0f} s"
        return proc.returncode, "\n".join(out.strip().splitlines()[-15:])
