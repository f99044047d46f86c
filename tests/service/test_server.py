"""server.Server against a real child process (tests/data/service/standin_server.py)."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_fixture import NEVER, frozen

from dflashctl import errors
from dflashctl.errors import DflashError
from dflashctl.service.server import Server
from dflashctl.service.sglang_0_5_11 import WARMED_UP_LINE
from dflashctl.service.stall import StallWatch
from dflashctl.smoke import ports

STANDIN = Path(__file__).parent.parent / "data" / "service" / "standin_server.py"


def free_port() -> int:
    return ports.free_port()


def make(tmp_path, mode, *flags, api_key=None, **env):
    port = free_port()
    child_env = dict(os.environ, STANDIN_MODE=mode, **env)
    key = ["--api-key", api_key] if api_key else []
    srv = Server([sys.executable, str(STANDIN), "--model-path", "m", "--port", str(port), *key, *flags], child_env,
                 tmp_path / "sglang.log", f"http://127.0.0.1:{port}", api_key=api_key)
    srv.start()
    return srv


def test_ready_only_after_health_answers_200(tmp_path):
    srv = make(tmp_path, "healthy", STANDIN_READY_AFTER="1.0")
    progress = []
    try:
        took = srv.wait_ready(30, on_progress=lambda t, line: progress.append((t, line)))
        assert took >= 1.0  # the stand-in answers 503 for its first second
        assert srv.poll() is None
        assert "GET /health_generate" in srv.log_tail()
    finally:
        assert srv.stop(grace=5) == 0  # SIGTERM reached the child, which exits 0 on it
    assert progress and progress[0][1].startswith("standin:")


def test_ready_by_one_token_of_ours_once_sglang_logged_its_warm_up(tmp_path):
    """SGLang 0.5.11's /health_generate sleeps before its 200 (here far longer than the start): serve is
    ready by its own one-token /generate, with the key, once the warm-up line is in this start's log."""
    ok = tmp_path / "ok"
    srv = make(tmp_path, "healthy", "--enable-metrics", api_key="k3y", STANDIN_READY_AFTER="0.5",
               STANDIN_HEALTH_SECONDS="600", STANDIN_OK_FILE=str(ok))
    try:
        srv.wait_ready(60)
        assert srv.ready_by == f"SGLang logged its warm-up done and {srv.base_url}/generate decoded a token"
        assert ok.read_text().splitlines() == ["200 /generate auth=Bearer k3y"]
        import urllib.request
        with urllib.request.urlopen(srv.base_url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "sglang:num_requests_total" in metrics
        assert any(line.startswith("sglang:num_requests_total") and line.rstrip().endswith(" 0.0")
                   for line in metrics.splitlines()), metrics  # log_metrics false: not one of its requests
    finally:
        srv.stop(grace=5)


def test_without_the_warm_up_line_health_generate_decides(tmp_path):
    """--log-level warning: SGLang logs no INFO line, so only /health_generate's 200 makes it ready."""
    ok = tmp_path / "ok"
    srv = make(tmp_path, "healthy", "--log-level", "warning", STANDIN_READY_AFTER="0.3",
               STANDIN_HEALTH_SECONDS="1", STANDIN_OK_FILE=str(ok))
    try:
        srv.wait_ready(60)
        assert srv.ready_by == f"{srv.base_url}/health_generate decoded a token"
        assert ok.read_text().splitlines() == ["200 /health_generate auth=None"]
        assert WARMED_UP_LINE not in srv.log_since_start()
    finally:
        srv.stop(grace=5)


def test_the_warm_up_line_counts_from_this_start_and_across_split_writes(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text(f"[2026-12-01 10:00:00] {WARMED_UP_LINE}\n")  # an earlier start appended to the same log
    watch = StallWatch(0, log, log.stat().st_size, look_for=(WARMED_UP_LINE,))
    watch.stalled()
    assert WARMED_UP_LINE not in watch.found
    head, tail = WARMED_UP_LINE[:17], WARMED_UP_LINE[17:]
    with open(log, "a") as f:
        f.write(f"[2026-12-01 10:05:00] {head}")
    watch.stalled()
    assert WARMED_UP_LINE not in watch.found
    with open(log, "a") as f:
        f.write(f"{tail}\n")
    watch.stalled()
    assert WARMED_UP_LINE in watch.found
    with open(log, "a") as f:
        f.write("[2026-12-01 10:05:01] INFO:     127.0.0.1:4242 - \"GET /model_info HTTP/1.1\" 200 OK\n")
    watch.stalled()
    assert WARMED_UP_LINE in watch.found  # once seen, stays seen


def test_crash_before_ready_raises_with_log_tail(tmp_path):
    srv = make(tmp_path, "crash", STANDIN_READY_AFTER="0.3")
    try:
        with pytest.raises(DflashError) as e:
            srv.wait_ready(60)
    finally:  # as serve does whatever ended the wait: a child still starting outlived the leader's death
        srv.stop(grace=5)
    assert e.value.exit_code == errors.SERVER_DIED_BEFORE_READY
    assert "exited with status 3" in str(e.value)
    assert "StructuralTag" in str(e.value)  # the reason is in the message, not only in the log
    assert srv.returncode == 3


def test_hang_times_out_while_child_still_runs(tmp_path):
    srv = make(tmp_path, "hang")
    try:
        with pytest.raises(DflashError) as e:
            srv.wait_ready(2)
        assert e.value.exit_code == errors.SERVER_START_TIMEOUT
        assert srv.poll() is None
    finally:
        srv.stop(grace=5)
    assert srv.poll() is not None


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('ignoring', flush=True)\ntime.sleep(600)\n")
    srv = Server([sys.executable, str(script)], dict(os.environ), tmp_path / "log", "http://127.0.0.1:9")
    srv.start()
    while "ignoring" not in srv.log_tail():
        time.sleep(0.05)
    assert srv.stop(grace=0.5) == -9


def test_a_child_that_outlives_sigkill_is_stuck_and_not_waited_for_again(tmp_path):
    """A process stuck in the driver ignores SIGKILL until it can run again (here: frozen). stop
    gives up after KILL_WAIT_S and says so; a second stop (serve's cleanup after its own) must not
    wait all over again, or serve's stop outlasts the unit's TimeoutStopSec."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    srv = Server([sys.executable, str(script)], dict(os.environ), tmp_path / "log", "http://127.0.0.1:9")
    srv.start()
    while "sleeping" not in srv.log_tail():
        time.sleep(0.05)
    with frozen(srv.pid):
        assert srv.stop(grace=0.5) is None and srv.stuck
        again = threading.Thread(target=srv.stop, kwargs={"grace": 3600}, daemon=True)
        again.start()
        again.join(NEVER)  # waiting again would take an hour
        assert not again.is_alive()
        assert srv.poll() is None  # still there, SIGKILL pending
    assert srv.wait(NEVER) in (-9, -15)  # thawed: a pending signal ends it


def test_stop_reaches_grandchildren_in_the_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "parent.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n")
    srv = Server([sys.executable, str(script)], dict(os.environ), tmp_path / "log", "http://127.0.0.1:9")
    srv.start()
    while not pidfile.exists() or not pidfile.read_text():
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    srv.stop(grace=5)
    for _ in range(100):  # the grandchild is not ours to reap: wait until it is gone or a zombie
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the grandchild outlived stop()")


def test_missing_interpreter_is_a_clear_error(tmp_path):
    srv = Server([str(tmp_path / "nope")], {}, tmp_path / "log", "http://127.0.0.1:9")
    with pytest.raises(DflashError) as e:
        srv.start()
    assert e.value.exit_code == errors.SERVER_DIED_BEFORE_READY
    assert "cannot start" in str(e.value)


def test_a_start_that_stops_making_progress_is_named_before_the_start_timeout(tmp_path):
    """The stand-in logs loading lines for 2 s (longer than the stall timeout: each line is progress),
    then goes silent while still answering health polls with 503 (not progress)."""
    srv = make(tmp_path, "stall", STANDIN_STALL_AFTER="2.0", STANDIN_PROGRESS_EVERY="0.2")
    try:
        with pytest.raises(DflashError) as e:
            srv.wait_ready(600, stall_timeout=1.0)
        assert e.value.exit_code == errors.SERVER_STALLED
        assert srv.poll() is None  # still running: the caller stops it
        text = str(e.value)
        assert "no start-up progress for 1 s (no new log output" in text
        # Stalled only after the last loading line: the lines before it kept it alive.
        assert "the last thing it logged: standin: Capturing CUDA graphs (bs=256)" in text
        assert "GET /health_generate" in srv.log_tail()  # polls were answered, yet not progress
    finally:
        srv.stop(grace=5)


class Samples:
    """GPU memory as a sampler would see it: grows while `growing`, then stays put."""

    def __init__(self, growing: int):
        self.growing, self.calls = growing, 0

    def __call__(self):
        self.calls += 1
        used = 1000 + 100 * min(self.calls, self.growing)
        return {"ok": True, "facts": {"gpus": [{"index": 0, "memory_mib": {"used": used}}]}}


def test_growing_gpu_memory_is_progress_and_a_stop_is_a_stall(tmp_path):
    """A silent child (no log after start) whose GPU memory grows for a while: not stalled until it
    stops growing. Ordering, not time: the stall comes after the last growth was sampled."""
    from dflashctl.service.stall import GpuMemory
    srv = make(tmp_path, "silent")
    samples = Samples(growing=30)  # 3 s of growth at 0.1 s a sample, three stall timeouts
    gpu = GpuMemory(samples, [0], interval=0.1).start()
    try:
        with pytest.raises(DflashError) as e:
            srv.wait_ready(600, stall_timeout=1.0, gpu=gpu)
        assert e.value.exit_code == errors.SERVER_STALLED
        assert samples.calls > 30  # it outlived every growing sample
        assert "no new log output and no change in GPU memory" in str(e.value)
    finally:
        gpu.stop()
        srv.stop(grace=5)


def test_stall_check_off_with_zero(tmp_path):
    srv = make(tmp_path, "stall", STANDIN_STALL_AFTER="0.1")
    try:
        with pytest.raises(DflashError) as e:
            srv.wait_ready(2, stall_timeout=0)
        assert e.value.exit_code == errors.SERVER_START_TIMEOUT
    finally:
        srv.stop(grace=5)


def test_a_progress_bar_redrawn_with_carriage_returns_is_progress(tmp_path):
    """tqdm redraws one line with \\r while SGLang loads weights: each redraw is progress."""
    log = tmp_path / "log"
    log.write_bytes(b"")
    now = [0.0]
    watch = StallWatch(10, log, 0, clock=lambda: now[0])
    for pct in (10, 40, 70):
        with open(log, "ab") as f:
            f.write(f"\rLoading safetensors checkpoint shards: {pct}%".encode())
        now[0] += 6
        assert not watch.stalled()
    with open(log, "ab") as f:
        f.write(b'\nINFO:     127.0.0.1:5 - "GET /health_generate HTTP/1.1" 503\n')
    now[0] += 6
    assert not watch.stalled()  # 6 s since the last redraw; the poll line did not reset it
    now[0] += 5
    assert watch.stalled()
    assert watch.last_line == "Loading safetensors checkpoint shards: 70%"


def test_a_readiness_token_refused_again_and_again_is_not_progress(tmp_path):
    """After the warm-up line serve sends its token every few seconds; a server that logs only the
    refusals (a 400 from its tokenizer manager) is stuck, and the stall check must still say so."""
    log = tmp_path / "log"
    log.write_text(f"[2026-12-01 10:05:00] {WARMED_UP_LINE}\n")
    now = [0.0]
    watch = StallWatch(10, log, 0, clock=lambda: now[0])
    assert not watch.stalled()
    for _ in range(4):
        with open(log, "a") as f:
            f.write('[2026-12-01 10:05:03] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 400 Bad Request\n')
        now[0] += 3
        watch.stalled()
    assert watch.stalled() and watch.last_line.endswith(WARMED_UP_LINE)


def test_a_failed_bind_of_another_port_while_sglang_listens_is_not_its_port_lost(tmp_path):
    """SGLang listens, then logs an "[Errno 98]" of another port (NCCL's, say): its own port is not
    lost, so it is not stopped, and it is ready once it answers."""
    port = free_port()
    code = ("import http.server, sys, time\n"
            "t0 = time.monotonic()\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200 if time.monotonic() - t0 > 1.0 else 503); self.end_headers()\n"
            "    def log_message(self, *a): pass\n"
            "s = http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
            "print('nccl: bind of port 29500 failed: [Errno 98] Address already in use', flush=True)\n"
            "s.serve_forever()\n")
    srv = Server([sys.executable, "-c", code, str(port)], dict(os.environ), tmp_path / "sglang.log",
                 f"http://127.0.0.1:{port}", listen=("127.0.0.1", port))
    srv.start()
    try:
        assert srv.wait_ready(30) >= 1.0
        assert srv.poll() is None  # not stopped
    finally:
        srv.stop(grace=5)
