"""SGLang's spawned children started from a process that has already imported their libraries
(standard library only: the stack's interpreter has no dflashctl).

SGLang 0.5.11 sets the `spawn` start method (entrypoints/engine.py, `_set_envs_and_config`) and
starts its scheduler(s) and detokenizer with `mp.Process`: each child is a fresh interpreter that
imports torch, transformers and SGLang again, about as long as the server's own imports. It cannot
use `fork` instead: SGLang's import initialises CUDA (`torch.cuda.is_available()`,
`get_device_capability()` at module level), and a fork after that cannot use the GPU.

Here, the server process (the first process of an instance, the one that pops $DFLASH_FASTSTART)
starts a *template* at once, beside its own imports. The template imports the libraries the
children import (the list in the file $DFLASH_FASTSTART names: the shipped list has third-party
modules only) and must never initialise CUDA. Torch's way to it is fenced off while it imports (what
sgl_kernel, Triton and SGLang's own modules ask about the GPU, the compute capability among it, is
answered from NVML where every GPU of the host is alike), and after each entry it checks that CUDA is untouched (nothing reached the fence,
torch not initialised, libcuda's `cuDeviceGetCount` still answering CUDA_ERROR_NOT_INITIALIZED): an
entry that touched it, or whose import failed, is left out and the template starts over without it
(a fresh exec; what an import did cannot be taken back). Then it checks it is safe to fork: NVML
shut down, no GPU device open, a test child forked from it in which torch is willing and the
driver's cuInit succeeds, one thread left once fork handlers ran (besides jemalloc's background
thread, which jemalloc's own fork handling covers; each child turns it back on where it can). When SGLang starts a child the
spawn way, the server sends the template what spawn would send a fresh interpreter (its preparation
data and the pickled process object, the file descriptors it carries) and its environment of that
moment; the template forks, and the child continues exactly as a spawned one does
(`multiprocessing.spawn.prepare`, then `process._bootstrap`), without importing those libraries again.

What stays as with spawn:
- the child is the server's own child: the server is a child subreaper (PR_SET_CHILD_SUBREAPER),
  the template forks twice and the middle process exits, so the child is re-parented to the server
  before it runs (SGLang's children signal `psutil.Process().parent()` with SIGQUIT when they fail,
  set PR_SET_PDEATHSIG against it, and the server waits for them with waitpid);
- the process group (serve signals the whole group, its GPU watch reads NVML by pid);
- the environment: the child gets the server's environment at the moment of its start. A variable
  that differs from the template's start and that a preloaded module read while it was imported
  (recorded; unless the server changed it exactly as the template's own imports did, the same line
  from the same value to the same value), or one only the loader or the interpreter read at exec
  (LD_*, PYTHON*, ...), or another executable (SGLang's numactl wrapper): that child is spawned as
  before, and the log says why.
Anything the template cannot do (it died, it is not ready when the server has waited as long as it
has itself run, a check above failed) falls back to spawn, with the reason in the log. The template
dies with the server (PR_SET_PDEATHSIG). Off: unset $DFLASH_FASTSTART (the instance setting
`fastStart = false`; by default it is on for an instance of one GPU, off for tensor parallelism).
"""

import ctypes
import datetime
import io
import json
import os
import signal
import socket
import struct
import sys
import time

ENV = "DFLASH_FASTSTART"  # the path of the preload list (JSON: {"preload": [...]}); absent or "0": off
TAG = "[dflash faststart]"
# Read by the dynamic loader, glibc or the interpreter once, at exec: a child must see them at start.
EXEC_ONLY = ("LD_", "GLIBC_TUNABLES", "MALLOC_", "PYTHON")
# How long the server waits for the template at its first child: as long as the server itself has
# run (a spawned child imports about what the server imported), at least READY_MIN_WAIT_S.
READY_MIN_WAIT_S = 30.0
# doctor's trial has no server racing it: it waits longer for the template (the first import after
# an install also compiles byte code, on a busy host); doctor's --timeout bounds the whole probe
SELF_CHECK_WAIT_S = 150.0
REPARENT_WAIT_S = 10.0  # the middle process exits at once; this bounds a stuck start
FORK_PROBE_WAIT_S = 60.0  # the test child's cuInit: well under a second on an H200
JEMALLOC_THREAD = "jemalloc_bg_thd"  # the name jemalloc gives its background threads
MAX_LEFT_OUT = 3
MAX_TEMPLATE_RESTARTS = 3  # a server that keeps changing what the loader reads: its children are spawned  # entries a template may leave out (starting over each time) before it gives up
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
NVML_ERROR_UNINITIALIZED = 1
MAX_FDS = 64
PID = struct.Struct("!q")
HEAD = struct.Struct("!II")  # header length, payload length

_server = None  # the Server of this process, once install() started a template
_setters: dict[str, str] = {}  # in the server: variable -> who first changed it through os.environ (module:line)
_jemalloc_at_fork = False  # jemalloc's background thread ran in the template: each child turns it back on
_inherited: list[int] = []  # in a child: the descriptors its pickled objects refer to, by index


def say(text: str) -> None:
    """A line in SGLang's log, stamped as SGLang stamps its own (smoke/startup.py reads them)."""
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    sys.stderr.write(f"[{now}] {TAG} {text}\n")
    sys.stderr.flush()


# --- the server side ------------------------------------------------------------------------------

def install() -> None:
    """In the instance's server process: start the template, route spawn through it. Nothing in a
    `python -c` process (probes, multiprocessing's own helpers) or where $DFLASH_FASTSTART is unset."""
    global _server
    if not sys.argv or sys.argv[0] == "-c" or _server is not None:
        return
    setting = os.environ.pop(ENV, "")  # popped: processes this one starts never start a template
    if not setting or setting == "0":
        return
    try:
        with open(setting) as f:
            preload = [str(m) for m in json.load(f)["preload"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        say(f"off: cannot read the preload list {setting} ({e}); SGLang spawns its children as before")
        return
    problem = become_subreaper()
    if problem:
        say(f"off: {problem}; SGLang spawns its children as before")
        return
    _server = Server(preload)
    _route_spawn()
    _note_setters()


def _note_setters() -> None:
    """Who changes each variable in the server, named where a child is spawned after all (and
    matched against the template's own imports' changes, Server.why_not). A variable read at exec
    only (LD_LIBRARY_PATH, ...) that the server changes after the template started: the template
    starts over from the new environment (Server.follow). os.environ's setters call the module's
    putenv/unsetenv, so wrapping those sees every change made through os.environ."""
    for name in ("putenv", "unsetenv"):
        real = getattr(os, name, None)
        if real is None:
            continue

        def wrapped(key, *value, _real=real):
            text = os.fsdecode(key)
            done = _real(key, *value)
            who = _setters.setdefault(text, _caller())
            if text.startswith(EXEC_ONLY):
                if _server is not None:
                    _server.follow(text, os.fsdecode(value[0]) if value else None, who)
            return done
        setattr(os, name, wrapped)


def _caller() -> str:
    """The first frame outside os, collections and this module: module:line (`os.environ[k] = v`
    and `os.environ.setdefault(k, v)` name the line that wrote them)."""
    frame = _outside(sys._getframe(2))
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}" if frame is not None else "?"


_PASSED_THROUGH = ("os", "_collections_abc", "collections.abc", __name__)  # _collections_abc calls itself collections.abc


def _outside(frame):
    """The first of `frame` and its callers that is not in os, collections or this module."""
    while frame is not None and frame.f_globals.get("__name__") in _PASSED_THROUGH:
        frame = frame.f_back
    return frame


def _route_spawn() -> None:
    """Every spawn-method child of this process asks the template first (the default context's
    Process and an explicit get_context("spawn") both start through SpawnProcess._Popen)."""
    import multiprocessing.context as context
    original = context.SpawnProcess._Popen
    context.SpawnProcess._Popen = staticmethod(lambda process_obj: _server.popen(process_obj, original))


def become_subreaper() -> str | None:
    """Orphans of this process's descendants become its children (a forked child among them)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux (this is {sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as e:
        return f"prctl is not available ({e})"
    return None


def _main_path_entry() -> str:
    """What the interpreter puts first on sys.path for this program (the template imports as it will)."""
    if sys.argv[0] == "-m" or not sys.argv[0]:
        return os.getcwd()
    return os.path.dirname(os.path.abspath(sys.argv[0]))


def _change(key: str, was: str | None, now: str | None) -> str:
    """One variable's change, short: who set it and what entries a path list gained or lost."""
    who = _setters.get(key, "not through os.environ")
    if was is not None and now is not None and ":" in f"{was}{now}":
        old, new = was.split(":"), now.split(":")
        gained = [p for p in new if p not in old]
        lost = [p for p in old if p not in new]
        what = ", ".join([f"+{p}" for p in gained] + [f"-{p}" for p in lost]) or "reordered"
    else:
        what = f"{was!r} -> {now!r}"
    return f"{key} set by {who}: {what[:300]}"


def _searched(value: str | None) -> list[str]:
    """The directories a library path list makes the loader search: its entries less those that are
    not directories (an empty entry is the working directory, and stays)."""
    return [p for p in value.split(":") if p == "" or os.path.isdir(p)] if value else []


def _same_search(key: str, was: str | None, now: str | None) -> bool:
    """A library path that only gained or lost directories that do not exist searches the same
    (on the H200, OpenCV's cv2 put its wheel's `lib64` in front of LD_LIBRARY_PATH for the processes
    it starts, a directory the wheel does not have): for the loader, and for a module that read it while importing to look
    for a library, the child forked from a template started before is the child spawn would give."""
    return key == "LD_LIBRARY_PATH" and _searched(was) == _searched(now)


def _exec_differences(was: dict, now: dict) -> list[str]:
    """The variables read at exec whose change would start a child differently."""
    return sorted(k for k in set(was) | set(now) if k.startswith(EXEC_ONLY) and was.get(k) != now.get(k)
                  and not _same_search(k, was.get(k), now.get(k)))


class Server:
    """The template, seen from the server process: started at once, asked for each child."""

    def __init__(self, preload: list[str]):
        import multiprocessing.spawn as spawn
        self.preload = preload
        self.started = time.monotonic()
        self.executable = os.fsdecode(spawn.get_executable())
        self.state: dict | None = None
        self.restarts = 0
        self._said_same: set[str] = set()  # changes said to be the same for the children (said once)
        self._start(dict(os.environ))

    def _start(self, env: dict) -> None:
        import subprocess
        self.env = env
        self.sock, theirs = socket.socketpair()
        argv = _boot_argv(theirs.fileno(), os.getpid(), {"preload": self.preload, "path0": _main_path_entry()})
        self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        theirs.close()

    def follow(self, key: str, value: str | None, who: str) -> None:
        """A variable read at exec changed in the server before its first child: the template starts
        over from the environment that child would be spawned with (its loader, its hash seed)."""
        if self.state is not None or self.restarts >= MAX_TEMPLATE_RESTARTS:
            return  # a child started already, or too many changes: why_not spawns, naming the change
        env = dict(os.environ)  # os.environ changes after its putenv: the new value is applied here
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
        if env == self.env:
            return
        if not _exec_differences(self.env, env):
            if key not in self._said_same:
                self._said_same.add(key)
                say(f"template: {_change(key, self.env.get(key), value)} (directories that do not exist: the "
                    "loader searches the same; the template goes on)")
            return
        self.proc.kill()
        self.proc.wait()
        self.sock.close()
        self.restarts += 1
        say(f"template: {key} changed in the server (set by {who}); it starts over from the new environment")
        self._start(env)

    def ready(self, at_least: float = READY_MIN_WAIT_S) -> dict:
        """The template's report (read once; waits for it the first time a child starts, at most
        as long as the server has run so far, and `at_least`: past that, spawning is not slower)."""
        if self.state is None:
            wait = max(at_least, time.monotonic() - self.started)
            self.sock.settimeout(wait)
            try:
                line = _read_line(self.sock)
                self.state = json.loads(line) if line else {"ok": False, "why": "the template exited"}
            except (OSError, ValueError) as e:
                self.proc.kill()  # it would only compete with the spawned children for the CPU
                self.state = {"ok": False, "why": f"not ready {time.monotonic() - self.started:.0f} s after "
                                                  f"the server's start (waited {wait:.0f} s: {e})"}
            self.sock.settimeout(None)
        return self.state

    def why_not(self) -> str | None:
        """Why this child must be spawned after all (None: fork it from the template)."""
        state = self.ready()
        if not state.get("ok"):
            return f"the template is not usable: {state.get('why')}"
        import multiprocessing.spawn as spawn
        if os.fsdecode(spawn.get_executable()) != self.executable:
            return f"the child is to run {spawn.get_executable()} (not {self.executable})"
        differ = {k for k in set(self.env) | set(os.environ) if self.env.get(k) != os.environ.get(k)
                  and not _same_search(k, self.env.get(k), os.environ.get(k))}
        exec_only = _exec_differences(self.env, dict(os.environ))
        if exec_only:
            changes = "; ".join(_change(k, self.env.get(k), os.environ.get(k)) for k in exec_only)
            return f"{', '.join(exec_only)} changed since the template started (read at exec only: {changes})"
        read = differ & set(state.get("env_read", []))
        read -= self._same_change_as_template(read, state.get("env_set") or {})
        read = sorted(read)
        if read:
            return f"{', '.join(read)} changed since the template read it while importing"
        return None

    def _same_change_as_template(self, keys: set[str], template_set: dict) -> set[str]:
        """The variables the server changed exactly as the template's own imports did: from the same
        value to the same value, by the same line (on the H100, scikit-learn's import sets
        KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK with os.environ.setdefault in both processes). That
        module found and left the variable in the template as it did in the server: a child forked
        from the template holds it as the server does, and sees the server's environment. Said once."""
        same = {k for k in keys if template_set.get(k) == {"was": self.env.get(k), "now": os.environ.get(k),
                                                            "by": _setters.get(k)}}
        for key in sorted(same - self._said_same):
            self._said_same.add(key)
            say(f"template: {key} set by {_setters[key]} in the server as in the template's own imports "
                f"({self.env.get(key)!r} -> {os.environ.get(key)!r}: the same change; its children fork)")
        return same

    def popen(self, process_obj, spawn_popen):
        why = self.why_not()
        if why is None:
            try:
                popen = TemplatePopen(process_obj)
                say(f"{process_obj.name}: forked from the template (pid {popen.pid})")
                return popen
            except NotStarted as e:
                why = str(e)
        say(f"{process_obj.name}: spawned: {why}")
        return spawn_popen(process_obj)

    def start_child(self, header: dict, payload: bytes, fds: list[int]) -> int:
        """Hand one child's start to the template; its pid once it runs as our own child."""
        status_r, status_w = os.pipe()
        try:
            head = json.dumps(header).encode()
            socket.send_fds(self.sock, [HEAD.pack(len(head), len(payload))], [status_w] + fds)
            self.sock.sendall(head + payload)
        except OSError as e:
            os.close(status_r)
            raise NotStarted(f"the template did not take the child ({e.strerror or e})") from None
        finally:
            os.close(status_w)
        try:
            data = _read_exact(status_r, PID.size, REPARENT_WAIT_S)
        finally:
            os.close(status_r)
        if len(data) < PID.size:
            raise NotStarted("the template did not start the child")
        return PID.unpack(data)[0]


class NotStarted(Exception):
    """Nothing of the child ran: spawning it instead is safe."""


def _read_exact(fd: int, n: int, timeout: float) -> bytes:
    import select
    data, deadline = b"", time.monotonic() + timeout
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


class _DupFd:
    """A descriptor a pickled object carries to the child: its place in the list sent along."""

    def __init__(self, index: int):
        self.index = index

    def detach(self) -> int:
        return _inherited[self.index]


def _popen_class():
    """multiprocessing's fork Popen, launching through the template (built on first use: the
    server imports multiprocessing's Popen machinery only when SGLang starts a child)."""
    import multiprocessing.popen_fork as popen_fork

    class _TemplatePopen(popen_fork.Popen):
        method = "spawn"  # what SGLang asked for; the child runs as a spawned one

        def __init__(self, process_obj):
            self._fds: list[int] = []
            super().__init__(process_obj)

        DupFd = _DupFd

        def duplicate_for_child(self, fd):
            self._fds.append(fd)
            return len(self._fds) - 1

        def _launch(self, process_obj):
            self.pid = _launch(self, process_obj)

    return _TemplatePopen


def TemplatePopen(process_obj):  # noqa: N802 (called like the class it makes)
    global TemplatePopen
    TemplatePopen = _popen_class()
    return TemplatePopen(process_obj)


def _launch(popen, process_obj) -> int:
    """What spawn's Popen sends a fresh interpreter, sent to the template instead."""
    from multiprocessing import context, reduction, resource_tracker, spawn, util
    prep = spawn.get_preparation_data(process_obj._name)
    buf = io.BytesIO()
    context.set_spawning_popen(popen)
    try:
        reduction.dump(prep, buf)
        reduction.dump(process_obj, buf)
    finally:
        context.set_spawning_popen(None)
    parent_r, child_w = os.pipe()  # the child holds child_w: EOF on parent_r when it exits
    child_r, parent_w = os.pipe()  # we hold parent_w: the child's parent sentinel
    try:
        fds = [child_w, child_r, resource_tracker.getfd()] + popen._fds
        pid = _server.start_child({"server_pid": os.getpid(), "env": dict(os.environ)},
                                  buf.getvalue(), fds)
    except BaseException:
        os.close(parent_r)
        os.close(parent_w)
        raise
    finally:
        os.close(child_w)
        os.close(child_r)
    popen.sentinel = parent_r
    popen.finalizer = util.Finalize(popen, util.close_fds, (parent_r, parent_w))
    return pid


# --- doctor's check ------------------------------------------------------------------------------

def self_check(preload_list: str) -> dict:
    """For `dflashctl doctor`, in the stack's interpreter: a template that imports the preload list
    an instance would use (the file `preload_list` names), one real child forked from it, and
    whether it came back as this process's own child; the template's report with it."""
    global _server
    problem = become_subreaper() or _missing_internals()
    if problem:
        return {"ok": False, "why": problem}
    try:
        with open(preload_list) as f:
            preload_entries = [str(m) for m in json.load(f)["preload"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"ok": False, "why": f"cannot read the preload list {preload_list} ({e})"}
    import multiprocessing as mp
    _server = Server(preload_entries)
    _route_spawn()
    state = _server.ready(at_least=SELF_CHECK_WAIT_S)
    report = {k: state.get(k) for k in ("seconds", "missing", "left_out", "fork_probe")}
    report["preloaded"] = len(state.get("preloaded") or [])
    if not state.get("ok"):
        return {"ok": False, "why": f"the template is not usable: {state.get('why')}", **report}
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_report_parent, args=(writer,), name="faststart-check")
    child.start()
    writer.close()
    got = reader.recv() if reader.poll(30) else None
    child.join(30)
    forked = type(child._popen).__name__ == "_TemplatePopen"
    if not forked:
        return {"ok": False, "why": f"the test child was spawned: {_server.why_not() or 'it did not start'}",
                **report}
    if got != [os.getpid(), os.getpgid(0)] or child.exitcode != 0:
        return {"ok": False, "why": f"the test child reported {got} and exited {child.exitcode} "
                                    f"(expected parent {os.getpid()}, group {os.getpgid(0)}, exit 0)", **report}
    return {"ok": True, "why": None, **report}


def _report_parent(writer) -> None:
    writer.send([os.getppid(), os.getpgid(0)])


def _missing_internals() -> str | None:
    """The multiprocessing and os internals this module builds on (CPython 3.10 to 3.13)."""
    import multiprocessing.context as context
    import multiprocessing.popen_fork as popen_fork
    import multiprocessing.resource_tracker as resource_tracker
    import multiprocessing.spawn as spawn
    needed = {"socket.send_fds": getattr(socket, "send_fds", None),
              "SpawnProcess._Popen": getattr(context.SpawnProcess, "_Popen", None),
              "popen_fork.Popen": getattr(popen_fork, "Popen", None),
              "spawn.get_preparation_data": getattr(spawn, "get_preparation_data", None),
              "spawn.prepare": getattr(spawn, "prepare", None),
              "resource_tracker._resource_tracker._fd": hasattr(resource_tracker._resource_tracker, "_fd") or None,
              "os._Environ._data": hasattr(os.environ, "_data") or None}
    missing = [name for name, found in needed.items() if found is None]
    return f"this Python ({sys.version.split()[0]}) lacks {', '.join(missing)}" if missing else None


# --- the template ---------------------------------------------------------------------------------

_fencing = False  # the template's imports run with CUDA fenced off (preload)


class _CudaFenced(RuntimeError):
    """Raised in the template where an import would initialise CUDA."""


def _boot_argv(sock_fd: int, server_pid: int, spec: dict) -> list[str]:
    """The template's command line (the server starts it so; a template that starts over re-runs it)."""
    here = os.path.dirname(os.path.abspath(__file__))  # on PYTHONPATH already, unless doctor's check
    boot = f"import sys; sys.path.append({here!r}); import dflash_faststart as f; f.template_main()"
    return [os.fsdecode(sys.executable), "-c", boot, str(sock_fd), str(server_pid), json.dumps(spec)]


def template_main() -> None:
    """`python -c` entry point: argv = socket fd, server pid, JSON {"preload", "path0", "left_out"}."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    server_pid, spec = int(sys.argv[2]), json.loads(sys.argv[3])
    if _die_with(server_pid):
        return  # the server is gone already
    if sys.path and sys.path[0] == "":
        sys.path[0] = spec["path0"]  # `-c` put the working directory first; the server has path0
    os.environ.pop(ENV, None)
    env_at_start = dict(os.environ)
    left_out = spec.get("left_out", [])
    state = preload(spec["preload"], {e["entry"] for e in left_out})
    state["left_out"] = left_out
    bad = state.pop("start_over", None)
    if bad is not None:
        if len(left_out) < MAX_LEFT_OUT:  # start over in a fresh process without that entry
            say(f"template: {bad['entry']} left out: {bad['why']}; starting over without it")
            spec = dict(spec, left_out=left_out + [bad])
            os.execve(sys.executable, _boot_argv(sock.fileno(), server_pid, spec), env_at_start)
        state.update(ok=False, why=f"importing {bad['entry']}: {bad['why']} (and {len(left_out)} entries "
                                   f"were left out already: {', '.join(e['entry'] for e in left_out)})")
    try:
        sock.sendall(json.dumps(state).encode() + b"\n")
    except OSError:
        return  # the server exited while we imported
    if not state["ok"]:
        say(f"template not usable: {state['why']}; SGLang spawns its children as before")
        return
    _set_up_process_titles()
    say(f"template ready: {len(state['preloaded'])} modules imported in {state['seconds']:.1f} s "
        f"(first {', '.join(state['preloaded'][:4])})")
    say(f"template: {len(state['missing'])} of the list not in this stack; {len(left_out)} left out "
        f"({', '.join(e['entry'] for e in left_out) or 'none'}); os.environ read whole while importing by "
        f"{', '.join(state['env_iterated_by']) or 'nothing'}; {state['capability'] + '; ' if state.get('capability') else ''}"
        f"NVML shut down {state['nvml_shutdowns']} time(s); "
        f"{_jemalloc_text(state['jemalloc'])}"
        f"a forked test child: {state['fork_probe']}")
    serve_forks(sock, server_pid)


def _set_up_process_titles() -> None:
    """setproctitle (SGLang's children name themselves sglang::scheduler, sglang::detokenizer with
    it) finds the command line it rewrites by walking back from the environment's first string, on
    its first use. Used first here, before any child takes the server's environment, it finds the
    template's own command line, and every child inherits that: its title is what it sets, not
    `python -c ... template_main()` (what ps, top and the GPU checks name it by)."""
    titles = sys.modules.get("setproctitle")
    if titles is not None and hasattr(titles, "_setproctitle"):  # the C module: the fallback does nothing
        try:
            titles.getproctitle()
        except Exception as e:  # noqa: BLE001 (a title is not worth the template)
            say(f"template: setproctitle could not be set up here ({type(e).__name__}: {e}); the "
                "children's titles may stay the template's")


def _die_with(server_pid: int) -> bool:
    """The template ends with the server (PR_SET_PDEATHSIG), also while it imports; True: the
    server is gone already. (The children it forks do not inherit this: they are the server's.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the server's closed socket still ends the template once it serves
    return os.getppid() != server_pid


class _RecordingEnviron(os._Environ):
    """os.environ that notes which variables are read, who writes each (module:line, as the server's
    _setters) and who reads all of them, while importing."""

    def __init__(self, real):
        super().__init__(real._data, real.encodekey, real.decodekey, real.encodevalue, real.decodevalue)
        self.read: set[str] = set()
        self.written: dict[str, str] = {}
        self.iterated_by: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        self.written.setdefault(key, _caller())
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self.written.setdefault(key, _caller())
        super().__delitem__(key)

    def __iter__(self):
        frame = _outside(sys._getframe(1))
        self.iterated_by.add(frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return super().__iter__()


def preload(entries: list[str], left_out: set[str] = frozenset()) -> dict:
    """Import each entry ("module" or "module:name", as `from module import name`) with CUDA fenced
    off, checking after each that CUDA is still untouched; the report the server decides by. An
    entry whose import tried to reach CUDA, or failed, ends the loop as `start_over` (what it left
    behind cannot be taken back: the template starts over without it)."""
    global _fencing
    real, started = os.environ, time.monotonic()
    before = dict(real)
    recording = os.environ = _RecordingEnviron(real)
    fence: dict | None = None
    fired: list[str] = []  # what reached the fence, in order
    answered: list[str] = []  # what NVML answered for torch, and to whom
    done, missing, start_over = [], [], None
    try:
        for entry in entries:
            if entry in left_out:
                continue
            if "torch" in sys.modules and fence is None:
                fence = _fence_cuda(sys.modules["torch"], fired, answered)
                _fencing = True
            result = _import(entry)
            touched = _cuda_touched(fired)
            if touched:
                start_over = {"entry": entry, "why": f"its import {touched}"}
                break
            if result == "ok":
                done.append(entry)
            elif result == "missing":
                missing.append(entry)
            else:
                start_over = {"entry": entry, "why": f"its import failed ({result})"}
                break
    finally:
        os.environ = real
        _fencing = False
        for (holder, name), value in (fence or {}).items():
            setattr(holder, name, value)
    state = {"ok": False, "why": None, "seconds": None, "preloaded": done, "missing": missing,
             "env_read": sorted(recording.read), "env_iterated_by": sorted(recording.iterated_by),
             "env_set": {k: {"was": before.get(k), "now": real.get(k), "by": who}
                         for k, who in sorted(recording.written.items()) if before.get(k) != real.get(k)},
             "capability": _answered_text(answered), "nvml_shutdowns": 0, "jemalloc": None, "fork_probe": None}
    if start_over is not None:
        state["start_over"] = start_over
        return state
    state["nvml_shutdowns"] = _shutdown_nvml()
    state["jemalloc"] = _jemalloc_threads()
    state["why"], state["fork_probe"] = fork_safety_problem()
    state["ok"] = state["why"] is None
    state["seconds"] = round(time.monotonic() - started, 3)
    return state


def _import(entry: str) -> str:
    import importlib
    module, _, name = entry.partition(":")
    try:
        imported = importlib.import_module(module)
        if name:
            getattr(imported, name)  # a lazy package (transformers) imports it here
        return "ok"
    except (ImportError, AttributeError):
        return "missing"  # not in this stack (or not a module): the child does without it too
    except Exception as e:  # _CudaFenced among them; _cuda_touched says so first
        return f"{type(e).__name__}: {e}"


def _fence_cuda(torch, fired: list[str], answered: list[str]) -> dict:
    """During the imports: torch answers is_available() from NVML (torch's own fork-safe check,
    PYTORCH_NVML_BASED_CUDA_CHECK); what SGLang's modules and their libraries ask about the GPU at
    import (sgl_kernel, Triton's driver, `is_sm90_supported()` and the like; docs/benchmarks.md, call
    7) is answered from NVML where one answer is true for every GPU of the host (NvmlAnswers); and
    anything else that would initialise CUDA through torch raises (and is noted in `fired`, even
    where the importer swallows the error). Returns what to restore."""
    saved = {}

    def fenced(what):
        def refuse(*args, **kwargs):
            fired.append(what)
            raise _CudaFenced(what)
        return refuse

    for holder, name in ((torch._C, "_cuda_init"), (torch._C, "_cuda_getDeviceCount")):
        if hasattr(holder, name):
            saved[(holder, name)] = getattr(holder, name)
            setattr(holder, name, fenced(f"torch._C.{name}"))
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return saved
    if hasattr(cuda, "_nvml_based_avail"):
        saved[(cuda, "_nvml_based_avail")] = cuda._nvml_based_avail
        cuda._nvml_based_avail = lambda: True
    answers = NvmlAnswers(cuda, fenced, answered)
    for name in answers.ANSWERED:
        if hasattr(cuda, name):
            saved[(cuda, name)] = getattr(cuda, name)
            setattr(cuda, name, answers.wrap(name, getattr(cuda, name)))
    return saved


class NvmlAnswers:
    """torch.cuda's questions about the GPU answered without CUDA while the template imports: the
    compute capability and the name from NVML, where every GPU of the host (not only the visible
    ones: a child may see others) has the same (the name: and none is split by MIG, whose devices
    CUDA names otherwise); the current device is 0 (no import has set one; a spawned child at import
    sees the same); properties only their `major`, `minor` and `name`. Only for a device torch sees.
    Anything else is refused as CUDA would be reached (the import that asked is left out, as
    before). Once the imports are done (a module may have kept a function, or a properties object)
    it is torch's own answer again."""

    ANSWERED = ("get_device_capability", "current_device", "get_device_name", "get_device_properties")

    def __init__(self, cuda, fenced, answered: list[str]):
        self.cuda, self.fenced, self.answered = cuda, fenced, answered
        self._devices: list = []  # NVML asked once, on the first question

    def wrap(self, name: str, real):
        answer, refuse = getattr(self, f"_{name}"), self.fenced(f"torch.cuda.{name}")

        def asked(*args, **kwargs):
            if not _fencing:
                return real(*args, **kwargs)
            found = answer(*args, **kwargs)
            if found is None:
                return refuse()
            frame = _outside_torch(sys._getframe(1))
            self.answered.append(f"{name} by {frame.f_globals.get('__name__', '?')}:{frame.f_lineno}"
                                 if frame is not None else f"{name} by ?")
            return found
        return asked

    def _alike(self, key: str):
        """The value every GPU of the host has for `key` (None: NVML cannot say, or they differ)."""
        if not self._devices:
            self._devices.append(nvml_devices())
        devices = self._devices[0]
        values = {d[key] for d in devices or []}
        if len(values) != 1 or (key == "name" and any(d["mig"] for d in devices)):
            return None
        return next(iter(values))

    def _seen(self, device) -> bool:
        index = _device_index(device)
        return index is not None and 0 <= index < _visible_count(self.cuda)

    def _get_device_capability(self, device=None):
        return self._alike("capability") if self._seen(device) else None

    def _current_device(self):
        return 0 if self._seen(0) else None

    def _get_device_name(self, device=None):
        return self._alike("name") if self._seen(device) else None

    def _get_device_properties(self, device=None):
        capability = self._get_device_capability(device)
        if capability is None:
            return None
        index = _device_index(device)
        return _Properties(capability, self._alike("name"), self.fenced,
                           lambda: self.cuda.get_device_properties(index))


class _Properties:
    """A device's properties as far as NVML answers them for every GPU alike; any other property is
    refused while the template imports and torch's own afterwards (a module kept the object)."""

    def __init__(self, capability, name, fenced, real):
        self.major, self.minor = capability
        self._name, self._fenced, self._real = name, fenced, real

    def __getattr__(self, attribute):  # only for what __init__ did not set
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if not _fencing:
            return getattr(self._real(), attribute)
        if attribute == "name" and self._name is not None:
            return self._name
        return self._fenced(f"torch.cuda.get_device_properties().{attribute}")()


def _device_index(device) -> int | None:
    """torch's device argument as an index (None: the current device, 0 before any set_device; a
    CUDA device index, a "cuda[:N]" string or a torch.device of type cuda). None: not a CUDA device."""
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    kind, index = (device, None) if isinstance(device, str) else (getattr(device, "type", None),
                                                                 getattr(device, "index", None))
    if isinstance(kind, str) and ":" in kind:
        kind, _, text = kind.partition(":")
        index = int(text) if text.isdigit() else -1
    return (0 if index is None else index) if kind == "cuda" else None


def _visible_count(cuda) -> int:
    """How many devices torch sees (its NVML-based count honours CUDA_VISIBLE_DEVICES; 0 where it
    would have to ask CUDA, which the fence refuses)."""
    try:
        return int(cuda.device_count())
    except Exception:
        return 0


def _outside_torch(frame):
    while frame is not None and (frame.f_globals.get("__name__", "") + ".").startswith("torch."):
        frame = frame.f_back
    return frame


def nvml_devices() -> list[dict] | None:
    """Every GPU of this host as NVML sees it: its CUDA compute capability, name and whether MIG is
    on (None: NVML cannot say). NVML is initialised here and shut down with torch's own use of it
    before any fork."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        found = []
        for i in range(count.value):
            handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            name, current, pending = ctypes.create_string_buffer(96), ctypes.c_uint(0), ctypes.c_uint(0)
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0 or
                    nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0
                    or nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(96)) != 0):
                return None
            mig = nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) == 0 and current.value
            found.append({"capability": (major.value, minor.value), "name": name.value.decode(errors="replace"),
                          "mig": bool(mig)})
        return found or None
    except (OSError, AttributeError):
        return None


def _answered_text(answered: list[str]) -> str | None:
    """The template's line on the capability it answered (None: nothing asked for it)."""
    if not answered:
        return None
    callers = list(dict.fromkeys(answered))
    return (f"answered from NVML (every GPU of this host alike) {len(answered)} time(s): "
            f"{', '.join(callers[:4])}{' and others' if len(callers) > 4 else ''}")


def _cuda_touched(fired: list[str]) -> str | None:
    """After one import: how it reached CUDA (None: it did not). Through torch (the fence, even when
    the importer caught the error: what it cached from that is wrong), or the driver itself (a
    library calling cuInit directly, which no fence sees)."""
    if fired:
        return f"tried to initialise CUDA ({', '.join(dict.fromkeys(fired))})"
    torch = sys.modules.get("torch")
    if torch is not None and _torch_cuda_initialized(torch):
        return "initialised CUDA through torch"
    rc = libcuda_state()
    if rc is not None and rc != CUDA_ERROR_NOT_INITIALIZED:
        return f"initialised CUDA in the driver (cuDeviceGetCount answered {rc})"
    return None


def _torch_cuda_initialized(torch) -> bool:
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and hasattr(cuda, "is_initialized") and cuda.is_initialized())


def libcuda_state() -> int | None:
    """cuDeviceGetCount's answer where libcuda is loaded in this process (None: not loaded)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    count = ctypes.c_int(0)
    return cuda.cuDeviceGetCount(ctypes.byref(count))


def _jemalloc_text(found: dict | None) -> str:
    if not found:
        return ""
    back = "turned back on there" if found["reachable"] else "left off there (its mallctl is not reachable)"
    return (f"jemalloc's background thread ({found['threads']}) left to jemalloc's own fork handling: off in "
            f"each forked child, {back}; ")


def _jemalloc_background_threads(on: bool) -> bool:
    """Set jemalloc's `background_thread` option; True where it was the other way and is `on` now."""
    mallctl = _mallctl()
    if mallctl is None:
        return False
    value, size = ctypes.c_bool(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_bool))
    if mallctl(b"background_thread", ctypes.byref(value), ctypes.byref(size), None, 0) != 0 or value.value == on:
        return False
    wanted = ctypes.c_bool(on)
    return mallctl(b"background_thread", None, None, ctypes.byref(wanted), ctypes.sizeof(wanted)) == 0


def _mallctl():
    """jemalloc's control function in this process: global (a preloaded jemalloc) or in a loaded
    library named after it. None: no jemalloc, or one that keeps its symbols to itself."""
    paths: list[str | None] = [None]
    try:
        with open("/proc/self/maps") as f:
            paths += sorted({line.split()[-1] for line in f if "jemalloc" in line.rsplit("/", 1)[-1]})
    except OSError:
        pass
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD) if path else ctypes.CDLL(None)
        except OSError:
            continue
        for name in ("mallctl", "je_mallctl"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                               ctypes.c_void_p, ctypes.c_size_t]
                return fn
    return None


def _shutdown_nvml() -> int:
    """torch's NVML check initialises NVML and never shuts it down; a child must not share it."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return 0  # never loaded
    count = 0
    while count < 64 and nvml.nvmlShutdown() != NVML_ERROR_UNINITIALIZED:
        count += 1
    return count


def fork_safety_problem() -> tuple[str | None, str]:
    """Why forking this process now would hand a child a broken CUDA or a held lock (None: safe),
    and what a test child forked from it found. The test child is forked first: fork handlers
    (OpenBLAS stops its thread pool before a fork) run, so the threads counted after it are the
    ones a fork would really leave behind."""
    rc = libcuda_state()
    if rc is not None and rc != CUDA_ERROR_NOT_INITIALIZED:
        return f"CUDA was initialised during the imports (cuDeviceGetCount answered {rc})", "not tried"
    torch = sys.modules.get("torch")
    if torch is not None and _torch_cuda_initialized(torch):
        return "torch initialised CUDA during the imports", "not tried"
    devices = _open_gpu_devices()
    if devices:
        return f"{', '.join(devices)} open after the imports (a CUDA or NVML handle a child would share)", "not tried"
    probe = _fork_probe()
    if probe.get("bad_fork"):
        return "torch marks a child forked from the template as unable to use CUDA", probe["text"]
    if probe.get("cuinit") not in (None, 0, CUDA_ERROR_NO_DEVICE):
        return (f"a child forked from the template could not initialise CUDA (cuInit answered "
                f"{probe['cuinit']})"), probe["text"]
    if probe.get("count_rc") not in (None, 0):
        return (f"in a child forked from the template CUDA initialised but cuDeviceGetCount answered "
                f"{probe['count_rc']}"), probe["text"]
    if probe.get("error"):
        return f"a child forked from the template failed: {probe['error']}", probe["text"]
    threads = [t for t in _threads() if t != JEMALLOC_THREAD]
    if len(threads) != 1:
        return (f"{len(threads)} threads run after the imports ({', '.join(threads)}; a fork copies "
                "only one)"), probe["text"]
    return None, probe["text"]


def _jemalloc_threads() -> dict | None:
    """jemalloc's background threads in this process (a GPU image's library links jemalloc with
    its `background_thread` option on; seen on the H200). They need not stop before a fork: jemalloc's
    fork handlers take its locks first and the child starts with background threads off. A child
    turns them back on (run_child) where jemalloc's mallctl is reachable, to run as a spawned one."""
    global _jemalloc_at_fork
    count = _threads().count(JEMALLOC_THREAD)
    _jemalloc_at_fork = count > 0
    return {"threads": count, "reachable": _mallctl() is not None} if count else None


def _open_gpu_devices() -> list[str]:
    found = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                found.add(target)
    except OSError:
        pass
    return sorted(found)


def _threads() -> list[str]:
    names = []
    for task in sorted(os.listdir(f"/proc/{os.getpid()}/task")):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            names.append(task)
    return names


def _fork_probe() -> dict:
    """Fork one test child that does what a scheduler does first: is torch willing, and does the
    driver initialise in it (cuInit, where a driver is loadable; on a GPU host this is the proof)."""
    import warnings
    reader, writer = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of threads here: counting them after is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(reader)
        found: dict = {}
        try:
            torch = sys.modules.get("torch")
            found["bad_fork"] = bool(torch is not None and hasattr(torch, "cuda")
                                     and hasattr(torch.cuda, "_is_in_bad_fork") and torch.cuda._is_in_bad_fork())
            try:
                cuda = ctypes.CDLL("libcuda.so.1")
            except OSError:
                cuda = None
            if cuda is not None:
                found["cuinit"] = cuda.cuInit(0)
                if found["cuinit"] == 0:  # and the driver then answers for its devices
                    count = ctypes.c_int(0)
                    found["count_rc"] = cuda.cuDeviceGetCount(ctypes.byref(count))
        except BaseException as e:
            found["error"] = f"{type(e).__name__}: {e}"
        os.write(writer, json.dumps(found).encode())
        os._exit(0)
    os.close(writer)
    data = _read_exact(reader, 65536, FORK_PROBE_WAIT_S)
    os.close(reader)
    os.waitpid(pid, 0)
    try:
        found = json.loads(data) if data else {"error": "it died without a word"}
    except ValueError:
        found = {"error": f"it said {data[:200]!r}"}
    cuinit = found.get("cuinit")
    found["text"] = ("no CUDA driver to try" if cuinit is None and "error" not in found else
                     "cuInit answered no device" if cuinit == CUDA_ERROR_NO_DEVICE else
                     "CUDA initialised in it" if cuinit == 0 else f"cuInit answered {cuinit}")
    return found


def serve_forks(sock: socket.socket, server_pid: int) -> None:
    """One child per request, until the server closes the socket (it exited)."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, HEAD.size, MAX_FDS)
        except OSError:
            return
        if not data:
            return
        data += _recv_exact(sock, HEAD.size - len(data))
        head_len, payload_len = HEAD.unpack(data)
        body = _recv_exact(sock, head_len + payload_len)
        if len(body) < head_len + payload_len:
            return
        _fork_twice(sock, fds, json.loads(body[:head_len]), body[head_len:], server_pid)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _fork_twice(sock, fds: list[int], header: dict, payload: bytes, server_pid: int) -> None:
    """The middle process exits at once, so the child is re-parented to the server (a subreaper)."""
    global _jemalloc_at_fork
    _jemalloc_at_fork = _jemalloc_at_fork or JEMALLOC_THREAD in _threads()  # jemalloc starts it lazily
    try:
        middle = os.fork()
    except OSError:
        middle = -1
    if middle == 0:
        sock.close()
        try:
            if os.fork() != 0:
                os._exit(0)
        except OSError:
            os._exit(1)
        run_child(fds, header, payload, server_pid)  # never returns
    for fd in fds:  # ours are copies; closing the status pipe tells the server when nothing started
        os.close(fd)
    if middle > 0:
        os.waitpid(middle, 0)


def run_child(fds: list[int], header: dict, payload: bytes, server_pid: int) -> None:
    """In the forked child: become the server's child, take its environment, run as spawn would.
    Ends the process (as a spawned child ends: SystemExit, so atexit handlers run); never returns
    into the template's loop."""
    status_w, child_w, child_r, tracker_fd, *inherited = fds
    deadline = time.monotonic() + REPARENT_WAIT_S
    while os.getppid() != server_pid:
        if time.monotonic() > deadline:
            os._exit(70)  # the server never sees a pid: it spawns the child instead
        time.sleep(0.001)
    os.write(status_w, PID.pack(os.getpid()))
    os.close(status_w)  # child_w stays open for our whole life: the server's sentinel
    _take_environment(header["env"])
    if _jemalloc_at_fork:
        _jemalloc_background_threads(True)
    try:
        code = _bootstrap(payload, inherited, tracker_fd, child_r)
    except SystemExit as e:
        code = e.code
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    raise SystemExit(code)


def _take_environment(env: dict) -> None:
    """The server's environment, changing only what differs: the variables the template started with
    stay where exec put them, behind the command line, where a process-title library looks for
    that command line (setproctitle walks back from environ[0]; os.environ.clear() would leave it
    nothing to find, and SGLang's children would keep the template's title)."""
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _bootstrap(payload: bytes, inherited: list[int], tracker_fd: int, parent_sentinel: int) -> int:
    from multiprocessing import process, reduction, resource_tracker, spawn
    _inherited[:] = inherited
    resource_tracker._resource_tracker._fd = tracker_fd  # the server's tracker, as spawn passes it
    stream = io.BytesIO(payload)
    process.current_process()._inheriting = True
    try:
        spawn.prepare(reduction.pickle.load(stream))
        process_obj = reduction.pickle.load(stream)
    finally:
        del process.current_process()._inheriting
    return process_obj._bootstrap(parent_sentinel=parent_sentinel)
