"""The fast start through `dflashctl serve` and the stand-in SGLang, whose server process spawns a
scheduler and a detokenizer as SGLang 0.5.11 does, each importing standin_heavy.py (which logs
every import by pid): with the fast start on (`fastStart = true`, or the default at tpSize 1) the
children are forked from the template and import nothing again; they stay the server's own children
in serve's process group; a child's failure reaches serve as it does without; off (`false`, or the
default at tpSize > 1) is SGLang's spawn, untouched."""

import json
import os
import signal
import time

import pytest

from dflashctl import errors
from serve_fixture import NEVER

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux only")


@pytest.fixture
def started(serve, tmp_path):
    """serve on the stand-in, ready; (serve's process, the children's pids, the pids that imported
    standin_heavy). The instance names its own preload list, as the environment setting allows."""
    def start(fast: bool | None, settings: dict | None = None, **standin):
        preload = tmp_path / "preload.json"
        preload.write_text(json.dumps({"preload": ["standin_heavy"]}))
        settings = dict(settings or {}, **({} if fast is None else {"fastStart": fast}))
        proc = serve("healthy", ["--skip-preflight"], settings=settings, ready_after=0.2,
                     environment={"DFLASH_FASTSTART": str(preload)}, import_log=tmp_path / "imports",
                     child_pidfile=tmp_path / "pids.json", **standin)
        assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)
        pids = json.loads((tmp_path / "pids.json").read_text())
        imports = [int(line) for line in (tmp_path / "imports").read_text().split()]
        return proc, pids, imports
    return start


def _stat(pid: int) -> tuple[int, int]:
    """(parent pid, process group) from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[2])


def _server_pid(proc) -> int:
    """SGLang's server process: serve's child that leads its own process group (serve's GPU watch
    is a child too)."""
    children = [int(c) for c in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    return next(c for c in children if _stat(c)[1] == c and "standin" in open(f"/proc/{c}/cmdline").read())


def _ended(pid: int, wait: float = 10.0) -> bool:
    """Gone, or dead and waiting for init to reap it (state Z)."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _title(pid: int) -> str:
    """The process title ps shows (the first string of its command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0].decode()


def _stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == 0, err
    return (proc.tmp / "sglang.log").read_text()


@pytest.mark.parametrize("fast", [True, None])  # None: the default, on for an instance of one GPU
def test_children_forked_from_the_template_import_nothing_again(started, fast):
    proc, pids, imports = started(fast)
    server = _server_pid(proc)
    assert pids["scheduler"] not in imports and pids["detokenizer"] not in imports
    assert server in imports and len(imports) == 2  # the server itself, and the template once
    template = next(pid for pid in imports if pid != server)
    for pid in (pids["scheduler"], pids["detokenizer"], template):
        assert _stat(pid) == (server, server)  # the server's own children, in its process group
    assert _title(pids["scheduler"]) == "sglang::scheduler"  # not the template's command line
    assert _title(pids["detokenizer"]) == "sglang::detokenizer"
    log = _stop(proc)
    assert "scheduler_0: forked from the template" in log and "detokenizer: forked from the template" in log
    for pid in (pids["scheduler"], pids["detokenizer"], template):
        assert _ended(pid), f"serve's stop left {pid} of the instance running"


# None with tpSize 2: the default, off where tensor parallelism was not measured with it
@pytest.mark.parametrize("fast, settings", [(False, {}), (None, {"tpSize": 2, "gpus": [0, 1]})],
                         ids=["false", "default-at-tp2"])
def test_off_spawns_as_sglang_does(started, fast, settings):
    proc, pids, imports = started(fast, settings)
    server = _server_pid(proc)
    assert sorted(imports) == sorted([server, pids["scheduler"], pids["detokenizer"]])  # each imports
    for pid in (pids["scheduler"], pids["detokenizer"]):
        assert _stat(pid) == (server, server)
    assert _title(pids["scheduler"]) == "sglang::scheduler"
    log = _stop(proc)
    assert "[dflash faststart]" not in log  # no template, no word of one


@pytest.mark.parametrize("fast", [True, False])
def test_a_failing_child_reaches_serve_within_a_second(started, tmp_path, fast):
    """The scheduler raises after ready and signals its parent (psutil's parent() in SGLang): that
    must be the server, which then ends the instance; serve reports it."""
    proc, pids, imports = started(fast, scheduler_fail_after=1.0, death_file=tmp_path / "died")
    _, err = proc.communicate(timeout=NEVER)
    seen = time.time()
    assert proc.returncode == errors.SERVER_DIED_AFTER_READY, err
    assert "Received sigquit from a child process" in err
    assert seen - float((tmp_path / "died").read_text()) < 1.0
    for pid in {pids["scheduler"], pids["detokenizer"], *imports}:  # the server, the template, the children
        assert _ended(pid), f"{pid} of the instance outlived serve"


@pytest.mark.parametrize("fast", [True, False])
def test_a_killed_child_is_seen_by_the_server_watchdog(started, fast):
    """SIGKILL (the OOM killer): nothing is said; the server's watchdog (SGLang's, once a second)
    finds the child gone, which needs it to be the server's own child (waitpid)."""
    proc, pids, _ = started(fast)
    killed = time.monotonic()
    os.kill(pids["detokenizer"], signal.SIGKILL)
    _, err = proc.communicate(timeout=NEVER)
    took = time.monotonic() - killed
    assert proc.returncode == errors.SERVER_DIED_AFTER_READY, err
    assert "Subprocess detokenizer" in err and "crashed with exit code -9" in err
    assert took < 2.5  # the watchdog's second, serve's poll, the process tree's end


def test_a_crash_while_the_template_still_imports_ends_the_instance_at_once(serve, tmp_path):
    """The server dies (SIGKILL) while its first child waits for a template whose import never ends:
    serve reports it at once and nothing is left (the template dies with the server)."""
    (tmp_path / "stuck_import.py").write_text(
        "import os, time\nopen(os.environ['STUCK_PIDFILE'], 'w').write(str(os.getpid()))\ntime.sleep(3600)\n")
    preload = tmp_path / "preload.json"
    preload.write_text(json.dumps({"preload": ["stuck_import"]}))
    pidfile = tmp_path / "template.pid"
    proc = serve("healthy", ["--skip-preflight"], settings={"fastStart": True},
                 environment={"DFLASH_FASTSTART": str(preload), "PYTHONPATH": str(tmp_path),
                              "STUCK_PIDFILE": str(pidfile)})
    end = time.monotonic() + NEVER
    while not (pidfile.exists() and pidfile.read_text()) and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    template = int(pidfile.read_text())
    os.kill(_server_pid(proc), signal.SIGKILL)
    _, err = proc.communicate(timeout=NEVER)  # the server would have waited 30 s for the template
    assert proc.returncode == errors.SERVER_DIED_BEFORE_READY, err
    assert "exited with status -9 (killed by SIGKILL) before it was ready" in err
    assert _ended(template), "the template outlived the instance"
