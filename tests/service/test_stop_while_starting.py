"""A stop that comes while a child process is being started does not lose the child.

CI once saw a stand-in SGLang outlive its `dflashctl serve`: the rollout tests' supervisor sent
SIGTERM just as serve started its server, serve's handler raised inside subprocess.Popen after the
fork, and with no pid recorded nothing stopped the server. Here the stop comes at exactly that
moment: a `sitecustomize` (or, in-process, a wrapped Popen) sends the signal once the child exists
and before Popen returns, as a signal between the fork and Popen's return would.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from serve_fixture import LAUNCHER, NEVER, free_port

from dflashctl import stop_signals
from dflashctl.host.gpu_watch import GpuWatch
from dflashctl.service.server import Server
from dflashctl.smoke.jit_prewarm import Prewarm

REPO = Path(__file__).resolve().parent.parent.parent
STOP_AFTER_FORK = "DFLASH_TEST_STOP_AFTER_FORK"
# Popen.__init__ wrapped: after the child is created, SIGTERM to ourselves when its command line
# names the word; the handler runs before __init__ returns, as in the real window.
SITECUSTOMIZE = f"""
import os, signal, subprocess
_init = subprocess.Popen.__init__
def _stopped_after_fork(self, args, *rest, **kw):
    _init(self, args, *rest, **kw)
    word = os.environ.get({STOP_AFTER_FORK!r})
    if word and any(word in str(a) for a in (args if isinstance(args, (list, tuple)) else [args])):
        os.environ.pop({STOP_AFTER_FORK!r})
        os.kill(os.getpid(), signal.SIGTERM)
subprocess.Popen.__init__ = _stopped_after_fork
"""


class Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise Stop(signum)


@pytest.fixture
def stop_after_fork(monkeypatch):
    """In this process: a raising SIGTERM handler and a Popen that is stopped after its fork."""
    real = subprocess.Popen

    class StoppedAfterFork(real):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            os.kill(os.getpid(), signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, _raise_stop)
    monkeypatch.setattr(subprocess, "Popen", StoppedAfterFork)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_signal_inside_deferred_is_handled_on_leaving_it():
    seen = []
    old = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        with pytest.raises(Stop):
            with stop_signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                seen.append("after the kill")  # not cut short
                assert signal.getsignal(signal.SIGTERM) is not _raise_stop
        assert seen == ["after the kill"]
        assert signal.getsignal(signal.SIGTERM) is _raise_stop  # put back
    finally:
        signal.signal(signal.SIGTERM, old)


def test_deferred_leaves_handlers_it_cannot_defer_alone():
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with stop_signals.deferred():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # ignored, inside and after
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old)


def test_the_server_started_as_the_stop_came_is_known_and_stopped(stop_after_fork, tmp_path):
    srv = Server([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ),
                 tmp_path / "server.log", "http://127.0.0.1:9")
    with pytest.raises(Stop):
        srv.start()
    assert srv.proc is not None, "the child was started but its pid was lost"
    pid = srv.pid
    assert _alive(pid)
    srv.stop(grace=5)
    assert not _alive(pid)


def test_the_gpu_watch_started_as_the_stop_came_is_known_and_stopped(stop_after_fork):
    watch = GpuWatch(sys.executable, [0], dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    with pytest.raises(Stop):
        watch.start()
    assert watch.pid is not None, "the GPU watch was started but its pid was lost"
    watch.stop()
    assert not _alive(watch.pid)


def test_the_jit_prewarm_started_as_the_stop_came_is_known_and_stopped(stop_after_fork):
    prewarm = Prewarm(sys.executable, dict(os.environ), [])
    with pytest.raises(Stop):
        prewarm.start()
    assert prewarm.proc is not None, "the JIT prewarm was started but its pid was lost"
    prewarm.stop()
    prewarm.proc.wait(10)
    assert not _alive(prewarm.proc.pid)


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries `marker` (those serve started, wherever they went)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return [p for p in found if _alive(p)]


def test_serve_stopped_as_it_starts_sglang_leaves_nothing_running(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    marker = f"DFLASH_TEST_MARK={uuid.uuid4().hex}"
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({
        "name": "t", "model": "stand-in", "port": free_port(), "gpus": [0],
        "environment": {"STANDIN_MODE": "healthy", "STANDIN_READY_AFTER": "30",
                        marker.split("=")[0]: marker.split("=")[1]}}))
    env = dict(os.environ, PYTHONPATH=f"{hook}:{REPO / 'python'}", **{STOP_AFTER_FORK: "standin_server"})
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.run([sys.executable, "-m", "dflashctl", "serve", "--config", str(settings), "--skip-preflight",
                           "--log-file", str(tmp_path / "sglang.log"), "--launcher", LAUNCHER],
                          env=env, capture_output=True, text=True, timeout=NEVER, start_new_session=True)
    deadline = time.monotonic() + 10  # serve waited for its group; a straggler gets a moment
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _marked(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"serve left its SGLang running:\n{proc.stderr}"
    assert proc.returncode == 0, proc.stderr
    assert "got SIGTERM; stopping SGLang (process group None)" not in proc.stderr
    assert "got SIGTERM; stopping SGLang (process group " in proc.stderr
