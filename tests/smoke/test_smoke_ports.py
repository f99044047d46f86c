"""The smoke's ports (issue 42: a CI run lost a server's port between its choice and its bind, exit
90). Ports come from outside the kernel's ephemeral range, and a server that lost its port to
another program is started again on a fresh one, saying so.

The stand-in binds its port only when the test lets it (FAKE_SGLANG_BIND_WHEN, as SGLang binds
last, after its model load); before that the test can take the port in another process, bound and
listening as any server would hold it.
"""

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

from smoke_runner import LOAD_ARGS, env_for

from dflashctl import errors
from dflashctl.smoke import ports

STARTED = re.compile(r"\[smoke\] started (\S+) on http://127\.0\.0\.1:(\d+) ")
HOLD = ("import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "print('held', flush=True); sys.stdin.read()")


class PortTaker:
    """Runs the smoke and reads its stderr; for each server start it announces, `take(run, start)`
    says whether another process takes that port first; then the stand-in may bind."""

    def __init__(self, tmp_path: Path, take, *args: str):
        self.gate, self.take = tmp_path / "gate", take
        self.gate.mkdir()
        self.starts: list[tuple[str, int]] = []
        self.holders: list[subprocess.Popen] = []
        self.stderr: list[str] = []
        env = env_for(FAKE_SGLANG_BIND_WHEN=str(self.gate), TVM_FFI_CACHE_DIR=str(tmp_path / "tvm-ffi"))
        cmd = [sys.executable, "-m", "dflashctl", "smoke", *LOAD_ARGS, "--triton-cache", str(tmp_path / "triton"),
               "--pair", "random", "--json", str(tmp_path / "result.json"), *args]
        self.proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            m = STARTED.search(line)
            if not m:
                continue
            run, port = m.group(1), int(m.group(2))
            self.starts.append((run, port))
            if self.take(run, sum(r == run for r, _ in self.starts)):
                holder = subprocess.Popen([sys.executable, "-c", HOLD, str(port)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True)
                self.holders.append(holder)
                assert holder.stdout.readline().strip() == "held"
            (self.gate / str(port)).touch()

    def wait(self, timeout: float = 300) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout)
            self.reader.join(30)
            return rc, "".join(self.stderr)
        finally:
            self.proc.kill()
            self.proc.wait()
            for h in self.holders:
                h.kill()
                h.wait()


def test_a_server_whose_port_another_program_took_starts_again_on_a_fresh_one(tmp_path):
    taker = PortTaker(tmp_path, lambda run, start: run == "baseline" and start == 1,
                      "--runs", "baseline,DFLASH")
    rc, stderr = taker.wait()
    assert rc == 0, stderr
    lost = taker.starts[[r for r, _ in taker.starts].index("baseline")][1]
    again = [p for r, p in taker.starts if r == "baseline"]
    assert len(again) == 2 and again[1] != lost
    assert (f"baseline: port {lost} was taken by another program before the server bound it; "
            f"starting it again on port {again[1]}") in stderr
    assert [r for r, _ in taker.starts].count("DFLASH") == 1  # the others were not disturbed
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and [r["name"] for r in result["runs"]] == ["baseline", "DFLASH"]
    outside = ports.ephemeral_range()
    for _, port in taker.starts:
        assert port <= ports.MAX_PORT
        if outside:
            assert not outside[0] <= port <= outside[1], (port, outside)


def test_a_server_that_loses_every_port_fails_naming_the_ports(tmp_path):
    taker = PortTaker(tmp_path, lambda run, start: True, "--runs", "baseline")
    rc, stderr = taker.wait()
    assert rc == errors.SERVER_DIED_BEFORE_READY, stderr
    lost = [str(p) for _, p in taker.starts]
    assert len(lost) == 3  # fleet.PORT_TRIES starts, then it gives up
    assert "address already in use" in stderr  # the server's own words, from its log
    assert f"its port was taken by another program on each of 3 starts (ports {', '.join(lost)})" in stderr
    assert "Traceback" not in stderr.split("address already in use")[-1]


def test_ports_are_chosen_outside_the_ephemeral_range():
    linux_default = (32768, 60999)
    assert ports.candidates(55535, 20000, linux_default) == [range(20000, 32768)]
    assert ports.candidates(65535, 20000, linux_default) == [range(20000, 32768), range(61000, 65536)]
    assert ports.candidates(55535, 20000, (10000, 40000)) == [range(40001, 55536)]
    # a host that made every port ephemeral: the whole span, and a lost port is retried
    assert ports.candidates(55535, 20000, (1024, 65535)) == [range(20000, 55536)]
    assert ports.candidates(55535, 20000, None) == [range(20000, 55536)]
    here = ports.ephemeral_range()
    for _ in range(50):
        port = ports.free_port()
        assert 20000 <= port <= ports.MAX_PORT and ports.is_free(port)
        if here and here != (1024, 65535):
            assert not here[0] <= port <= here[1]


def test_a_port_held_by_a_listening_socket_is_not_free(tmp_path):
    held = subprocess.Popen([sys.executable, "-c", HOLD, str(port := ports.free_port())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "held"
        assert not ports.is_free(port)
    finally:
        held.kill()
        held.wait()
