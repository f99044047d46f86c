"""`dflashctl serve` as a real process, with a real NOTIFY_SOCKET and a stand-in SGLang child."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from leak_check import live_stat
from serve_fixture import NEVER, descendants, free_port, frozen

from dflashctl import errors
from dflashctl.service import sdnotify
from dflashctl.service.unit_text import unit_data


def test_ready_only_after_a_decode_then_clean_stop(serve):
    proc = serve("healthy", ["--skip-preflight"], ready_after=1.0)
    assert proc.notify.recv_until("READY=1", proc)
    assert proc.ok_file.exists()  # the stand-in had answered 200 on /health_generate before READY
    assert any(m.startswith("STATUS=") for m in proc.notify.messages[:-1])
    argv = json.loads((proc.tmp / "argv.json").read_text())
    assert argv["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert "--grammar-backend" in argv["argv"] and "xgrammar" in argv["argv"]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == 0, err
    assert "STOPPING=1" in proc.notify.messages or proc.notify.recv_until("STOPPING=1", proc, 1)
    assert "got signal 15" in (proc.tmp / "sglang.log").read_text()  # forwarded to the child


def test_sglang_stuck_past_sigkill_is_named_and_serve_stops_before_systemd_kills_it(serve):
    """SGLang stuck in the driver (here: frozen) outlives SIGTERM and SIGKILL. serve names it and
    exits 0 within the unit's TimeoutStopSec, not waiting for it a second time in its cleanup."""
    timeout_stop = float(unit_data()["service"]["TimeoutStopSec"].rstrip("s"))
    proc = serve("healthy", ["--skip-preflight"], ready_after=0.3)
    assert proc.notify.recv_until("READY=1", proc)
    sglang = [pid for pid in descendants(proc.pid)  # not serve's own helpers (its GPU watch's probes)
              if b"standin_server" in _cmdline(pid)]
    assert sglang, descendants(proc.pid)
    with frozen(*sglang):
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=timeout_stop)  # systemd's SIGKILL would come here
        assert all(live_stat(pid) for pid in sglang)  # frozen: none could exit (nor is a zombie)
    assert proc.returncode == 0, err
    assert f"SGLang (pid {sglang[0]}) did not exit 30 s after SIGTERM nor 10 s after SIGKILL" in err
    assert "ps -o stat,wchan" in err
    for pid in sglang:  # thawed: the pending signals end them
        for _ in range(200):
            if live_stat(pid) is None:  # gone, or a zombie its new parent has yet to reap
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"pid {pid} outlived its thaw")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone already


def test_crash_before_ready_is_reported_at_once(serve):
    proc = serve("crash", ["--skip-preflight"], ready_after=0.3)
    out, err = proc.communicate(timeout=NEVER)  # startTimeoutSec is 600: this returns on the crash
    assert proc.returncode == errors.SERVER_DIED_BEFORE_READY
    assert "exited with status 3 before it was ready" in err
    assert "StructuralTag" in err  # the log tail is in the message
    proc.notify.drain()
    assert not any("READY=1" in m for m in proc.notify.messages)
    assert any(m.startswith("STATUS=failed") for m in proc.notify.messages)


def test_hang_ends_with_start_timeout(serve):
    proc = serve("hang", ["--skip-preflight"], settings={"startTimeoutSec": 2})
    out, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.SERVER_START_TIMEOUT
    assert "not ready after 2 s" in err
    assert "got signal 15" in (proc.tmp / "sglang.log").read_text()  # the hung child was stopped
    proc.notify.drain()
    assert not any("READY=1" in m for m in proc.notify.messages)


def test_death_after_ready(serve):
    proc = serve("die-after-ready", ["--skip-preflight"], die_after=0.5)
    assert proc.notify.recv_until("READY=1", proc)
    out, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.SERVER_DIED_AFTER_READY
    assert "exited with status 4 while serving" in err
    assert "illegal memory access" in err


def test_child_log_reaches_stderr(serve):
    proc = serve("crash", ["--skip-preflight"], ready_after=0.3)
    _, err = proc.communicate(timeout=NEVER)
    assert "standin: Loading safetensors checkpoint shards" in err  # the journal sees SGLang's log


def test_bad_config_exits_config(serve):
    proc = serve("healthy", ["--skip-preflight"], settings={"port": "x"})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.CONFIG
    assert "port: must be an integer" in err
    assert not (proc.tmp / "argv.json").exists()  # nothing was started


def test_api_key_from_systemd_credentials(serve, tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("s3cret\n")
    proc = serve("healthy", ["--skip-preflight"], settings={"apiKeyFile": "/nonexistent/key"},
                 env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert proc.notify.recv_until("READY=1", proc)
    argv = json.loads((proc.tmp / "argv.json").read_text())["argv"]
    assert argv[argv.index("--api-key") + 1] == "s3cret"
    assert "auth=Bearer s3cret" in proc.ok_file.read_text()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=NEVER)
    assert proc.returncode == 0


def test_missing_api_key_is_a_config_error(serve):
    proc = serve("healthy", ["--skip-preflight"], settings={"apiKeyFile": "/nonexistent/key"})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.CONFIG
    assert "cannot read the API key /nonexistent/key" in err


def test_preflight_failure_in_a_broken_environment(serve, tmp_path):
    """The test venv has no torch: a real broken environment. SGLang must never be started."""
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has torch")
    proc = serve("healthy", ["--python", sys.executable])
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode in errors.NO_RESTART and proc.returncode != errors.CONFIG, err
    assert "preflight" in err and "SGLang was not started" in err and "fix:" in err
    assert not (proc.tmp / "argv.json").exists()
    proc.notify.drain()  # systemd's StatusText is the last STATUS=: the failure and its fix
    last = [m for m in proc.notify.messages if m.startswith("STATUS=")][-1]
    assert last.startswith(f"STATUS=failed (exit {proc.returncode}): preflight: "), last
    assert "SGLang was not started" in last and "1. " in last and "fix: " in last, last  # the list


def test_dry_run_prints_the_command(tmp_path, capsys):
    from dflashctl import cli
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m", "gpus": [1], "apiKeyFile": "/k"}))
    assert cli.main(["serve", "--config", str(f), "--dry-run", "--python", "/py"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["argv"][:3] == ["/py", "-m", "sglang.launch_server"]
    assert "<apiKeyFile>" in out["argv"]
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize("extra, forks", [({}, True), ({"fastStart": False}, False),
                                          ({"tpSize": 2, "gpus": [0, 1]}, False),
                                          ({"tpSize": 2, "gpus": [0, 1], "fastStart": True}, True)])
def test_dry_run_shows_the_fast_start(tmp_path, capsys, extra, forks):
    """--dry-run's environment says whether SGLang's children would be forked (the default: on at tpSize 1)."""
    from dflashctl import cli
    from dflashctl.host import faststart, kernels
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m", "gpus": [0], **extra}))
    assert cli.main(["serve", "--config", str(f), "--dry-run", "--python", "/py"]) == 0
    env = json.loads(capsys.readouterr().out)["env"]
    assert (faststart.ENV in env) is forks, env
    assert (str(kernels.HOOK_DIR) in env.get("PYTHONPATH", "").split(os.pathsep)) is forks, env


def test_sdnotify_abstract_socket():
    name = f"dflash-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(100) == b"READY=1"
    assert sdnotify.notify("READY=1", {}) is False


def _tool(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)


def test_jit_toolchain_found_on_path_or_cuda_home(tmp_path):
    from dflashctl.service.preflight import jit_toolchain_warnings
    bin_dir = tmp_path / "bin"
    for name in ("nvcc", "c++"):
        _tool(bin_dir, name)
    assert jit_toolchain_warnings({"PATH": str(bin_dir)}) == []
    cuda = tmp_path / "cuda"
    _tool(cuda / "bin", "nvcc")
    (bin_dir / "nvcc").unlink()
    assert jit_toolchain_warnings({"PATH": str(bin_dir), "CUDA_HOME": str(cuda)}) == []


def test_jit_toolchain_names_each_missing_tool(tmp_path):
    from dflashctl.service.preflight import jit_toolchain_warnings
    empty = tmp_path / "empty"
    empty.mkdir()
    [w] = jit_toolchain_warnings({"PATH": str(empty), "CUDA_HOME": str(tmp_path / "nocuda"),
                                  "CXX": "g++-13"})
    assert "CUDA_HOME=" in w and "has no bin/nvcc" in w
    assert "'g++-13'" in w and f"PATH={empty}" in w


def test_preflight_warns_of_a_missing_jit_toolchain_before_the_probes(serve, tmp_path):
    """The unit's PATH (systemd's default, or NixOS's coreutils-only path) may lack nvcc and c++."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    proc = serve("healthy", ["--python", sys.executable], env={"PATH": str(empty)})
    _, err = proc.communicate(timeout=NEVER)
    assert "preflight warning: SGLang compiles its JIT kernels" in err, err
    assert "the C++ compiler 'c++'" in err
    proc.notify.drain()
    assert any("JIT kernels" in m for m in proc.notify.messages if m.startswith("STATUS="))


def test_a_stalled_start_is_stopped_and_named(serve):
    # fastStart off: the stand-in imports nothing, so the template's lines would land after its
    # stalled step; in SGLang they come during its imports, before any step of the GPU's
    proc = serve("stall", ["--skip-preflight"], settings={"stallTimeoutSec": 1, "fastStart": False},
                 stall_after=0.5)
    _, err = proc.communicate(timeout=NEVER)  # startTimeoutSec is 600
    assert proc.returncode == errors.SERVER_STALLED, err
    assert errors.SERVER_STALLED not in errors.NO_RESTART
    assert "no start-up progress for 1 s" in err
    assert "the last thing it logged: standin: Capturing CUDA graphs (bs=256)" in err
    assert "raise stallTimeoutSec" in err
    assert "got signal 15" in (proc.tmp / "sglang.log").read_text()  # the stalled child was stopped
    proc.notify.drain()
    assert any(m.startswith("STATUS=failed: SGLang made no start-up progress") for m in proc.notify.messages)


def _holder(port: int, directory: Path) -> subprocess.Popen:
    """Another program listening on `port` (its own process, so serve names a pid that is not its own)."""
    script = directory / "port_holder.py"
    script.write_text("import socket, sys, time\n"
                      "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
                      "print('listening', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def test_a_port_another_program_listens_on_is_named_before_anything_starts(serve, tmp_path):
    port = free_port()
    holder = _holder(port, tmp_path)
    try:
        proc = serve("healthy", settings={"port": port})  # the preflight would run probes: it never comes
        _, err = proc.communicate(timeout=NEVER)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == errors.PORT_TAKEN, err
    assert f"127.0.0.1:{port} is taken: pid {holder.pid} ({sys.executable} {tmp_path}/port_holder.py {port})" in err
    assert "give this instance another `port`" in err
    assert "preflight" not in err  # refused before the probes, with no SGLang started
    assert not (proc.tmp / "argv.json").exists()
    proc.notify.drain()
    assert any(m.startswith(f"STATUS=failed (exit {errors.PORT_TAKEN}): 127.0.0.1:{port} is taken")
               for m in proc.notify.messages)


def _take_port_once_sglang_starts(proc, port: int, sock: socket.socket) -> None:
    """Free at serve's check, taken before SGLang listens (SGLang binds only after the weights)."""
    for line in proc.stderr:
        if "starting SGLang" in line:
            break
    else:
        raise AssertionError("serve never started SGLang")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()


def test_a_port_taken_while_sglang_loads_is_named_at_the_failed_bind(serve, tmp_path):
    """SGLang's bind fails and it hangs (its warm-up asks the holder, which never answers, for
    minutes): serve sees the bind error in the log, stops SGLang and names the holder."""
    pids = tmp_path / "pids.json"
    proc = serve("healthy", ["--skip-preflight"], listen_after=2, child_pidfile=pids)
    port = json.loads((tmp_path / "settings.json").read_text())["port"]
    with socket.socket() as taken:
        _take_port_once_sglang_starts(proc, port, taken)
        _, err = proc.communicate(timeout=NEVER)  # the stand-in alone would hang 2 to 12 minutes
    assert proc.returncode == errors.PORT_TAKEN, err
    assert f"127.0.0.1:{port} is taken: pid {os.getpid()} (" in err
    assert "SGLang loaded the model, then could not listen, and was stopped" in err
    assert f"standin: cannot listen on 127.0.0.1:{port}: [Errno 98]" in err  # SGLang's own line, in the log tail
    children = json.loads(pids.read_text())  # the scheduler and detokenizer had started, and are killed:
    end = time.monotonic() + NEVER          # a SIGKILL takes effect when the kernel next runs them
    while any(live_stat(pid) is not None for pid in children.values()):
        assert time.monotonic() < end, f"SGLang's children outlived serve: {children}"
        time.sleep(0.05)


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_answers_from_another_server_on_the_port_are_not_taken_for_readiness(serve, tmp_path):
    """Another server (say a stale SGLang) listens on the port before this SGLang does and answers
    every request 200: serve's readiness request is answered, but not by its own SGLang. No READY=1:
    SGLang is stopped and the other server named."""
    proc = serve("healthy", ["--skip-preflight"], listen_after=30)
    port = json.loads((tmp_path / "settings.json").read_text())["port"]
    other = http.server.ThreadingHTTPServer(("127.0.0.1", port), _AnswersEverything, bind_and_activate=False)
    _take_port_once_sglang_starts(proc, port, other.socket)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        _, err = proc.communicate(timeout=NEVER)
    finally:
        other.shutdown()
        other.server_close()
    assert proc.returncode == errors.PORT_TAKEN, err
    assert f"127.0.0.1:{port} is taken: pid {os.getpid()} (" in err
    assert "may have been answered by it, not by this instance's SGLang, which was stopped" in err
    proc.notify.drain()
    assert not any("READY=1" in m for m in proc.notify.messages)
