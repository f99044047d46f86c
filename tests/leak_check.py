"""No test leaves a process behind (issue 42: full runs left stand-in servers listening).

Registered in conftest.py for every test. It reads /proc (psutil may be missing), twice per test:
the processes of this session before a test's setup and after its teardown. A process that came
and stayed fails that test's teardown, named with its command line and the ports it listens on,
and is killed, so the next test starts clean. "Of this session": a descendant of pytest, or a
process whose environment carries SESSION_ENV (an orphan whose parent died was reparented away
from pytest, and those are the ones left running).

Processes a fixture of wider scope (module, session) starts live as long as the fixture: they are
its own until it is finalized, and a leak of that fixture's when they outlive its teardown. A new
process below one that was already running (a module's server restarting its child) belongs to
that older one, not to the test.
"""

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

SESSION_ENV = "DFLASH_TEST_SESSION"
# Set anew, also under an outer session (tests/regenerate runs pytest): each session checks its own.
os.environ[SESSION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
MARK = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
GRACE_S = 5.0  # a process told to stop just before the test ended may still be on its way out
ME = os.getpid()
SESSION_START = None  # clock ticks since boot, /proc/self/stat's starttime


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks since boot: tells a reused pid from the process once there


def live_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, starttime) of a live process; None when gone (or a zombie: dead)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # os.open: a scan reads a few hundred of these
        try:
            fields = os.read(fd, 1024).rsplit(b")", 1)[1].split()
        finally:
            os.close(fd)
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), fields[0].decode(), int(fields[19])


def session_processes() -> dict[int, Proc]:
    """Every live process of this session except pytest itself."""
    seen: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == ME:
            continue
        st = live_stat(int(name))
        if st is not None:
            seen[int(name)] = Proc(int(name), st[0], st[2])
    ours = {ME}
    grew = True
    while grew:  # descendants of pytest, whatever order /proc lists them in
        grew = False
        for p in seen.values():
            if p.pid not in ours and p.ppid in ours:
                ours.add(p.pid)
                grew = True
    for p in seen.values():
        if p.pid not in ours and p.start >= SESSION_START and _marked(p.pid):
            ours.add(p.pid)
    ours.discard(ME)
    return {pid: seen[pid] for pid in ours}


def _marked(pid: int) -> bool:
    try:
        return MARK in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    listens = listening_ports(pid)
    where = f" (listening on {', '.join(listens)})" if listens else ""
    return f"pid {pid} `{cmd[:300]}`{where}"


def listening_ports(pid: int) -> list[str]:
    """host:port of each TCP socket the process listens on (its own network namespace's tables)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addr, port = f[1].rsplit(":", 1)
                host = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)) if table == "tcp" else "[::]"
                found.append(f"{host}:{int(port, 16)}")
    return found


def _alive(procs: dict[int, Proc]) -> dict[int, Proc]:
    out = {}
    for pid, p in procs.items():
        st = live_stat(pid)
        if st is not None and st[2] == p.start:
            out[pid] = p
    return out


def settle_and_kill(leftovers: dict[int, Proc]) -> list[str]:
    """Give the leftovers GRACE_S to end, then name and kill what is still running."""
    deadline = time.monotonic() + GRACE_S
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = _alive(leftovers)
    named = [describe(pid) for pid in sorted(leftovers)]
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid, p in leftovers.items():  # reap our own children, so none stays a zombie
        end = time.monotonic() + GRACE_S
        while p.ppid == ME and time.monotonic() < end:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break  # its Popen (or the test) reaped it
            time.sleep(0.02)
    return named


def new_roots(before: dict[int, Proc], after: dict[int, Proc], exempt: dict[int, Proc]) -> dict[int, Proc]:
    """Processes in `after`, neither in `before` nor `exempt`, with no such older one above them:
    what the test started and left, and below them what those started."""
    new = {pid: p for pid, p in after.items() if before.get(pid) != p and exempt.get(pid) != p}
    return {pid: p for pid, p in new.items() if not _below_older(p, after, new)}


def _below_older(p: Proc, procs: dict[int, Proc], new: dict[int, Proc]) -> bool:
    parent = procs.get(p.ppid)
    while parent is not None:
        if parent.pid not in new:
            return True
        parent = procs.get(parent.ppid)
    return False


class LeakCheck:
    def __init__(self):
        self.owned: dict[int, tuple[str, dict[int, Proc]]] = {}  # id(fixturedef) -> (name, its processes)
        self.late: list[str] = []  # fixtures finalized with processes still running, for the current test
        self.before: dict[int, Proc] = {}

    def exempt(self) -> dict[int, Proc]:
        out: dict[int, Proc] = {}
        for _, procs in self.owned.values():
            out.update(procs)
        return out

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.before = session_processes()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            return (yield)
        before = session_processes()
        try:
            return (yield)
        finally:
            made = {pid: p for pid, p in session_processes().items() if before.get(pid) != p}
            if made:
                self.owned[id(fixturedef)] = (fixturedef.argname, made)

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        name, procs = self.owned.pop(id(fixturedef), (None, {}))
        if procs and _alive(procs):
            self.late += [f"fixture {name!r} ({fixturedef.scope}) left running: {d}"
                          for d in settle_and_kill(_alive(procs))]

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        try:
            result = yield
        except BaseException:
            self.leftovers()  # cleaned up; the teardown's own error is the one reported
            raise
        problems = self.leftovers()
        if problems:
            pytest.fail(f"{item.nodeid} leaked processes (killed now):\n  " + "\n  ".join(problems),
                        pytrace=False)
        return result

    def leftovers(self) -> list[str]:
        """What the test (and fixtures finalized in its teardown) left running, each killed."""
        found = new_roots(self.before, session_processes(), self.exempt())
        problems = [f"still running: {d}" for d in settle_and_kill(found)] + self.late
        self.late = []
        return problems


def pytest_configure(config):
    global SESSION_START
    SESSION_START = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    config.pluginmanager.register(LeakCheck(), "dflash-leak-check")
