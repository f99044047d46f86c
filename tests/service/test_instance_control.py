"""`--restart-command`'s runner (service/instance_control.Command) with real shells and real process groups.

The restart scripts are the ones that broke rollouts: a `sleep` holding the command's output past its
deadline, a server started in the background without redirecting its output. Each test learns the
command's process group from the script itself (its shell's, from /proc) and checks
that no process of it is left, by pgid, in /proc. Deadlines are short, the margins around them wide:
the machine running the tests may be loaded.
"""

import time
from pathlib import Path

import pytest
from dflashctl.service.instance_control import STOPPED, TIMED_OUT, Command, group_members
from rollout_harness import kill_groups

MARGIN_S = 20.0  # what a loaded machine may add to a deadline; a hang is minutes


def script(tmp_path: Path, body: str) -> str:
    """A --restart-command template running `body` under sh, which first writes its process group to `pgid`."""
    path = tmp_path / "restart.sh"
    path.write_text(f"cut -d' ' -f5 /proc/$$/stat > {tmp_path}/pgid\n{body}\n")
    return f"sh {path} {{name}}"


def pgid_of(tmp_path: Path) -> int:
    return int((tmp_path / "pgid").read_text())


@pytest.fixture
def reap():
    """Ends, after the test, any process group a failing test left behind."""
    groups = []
    yield groups.append
    kill_groups(groups)


def timed(cmd: Command, *args, **kwargs):
    t0 = time.monotonic()
    rc, out = cmd.restart(*args, **kwargs)
    return rc, out, time.monotonic() - t0


def test_a_sleep_holding_its_output_ends_at_the_deadline_with_its_output(tmp_path, reap):
    # the script's own process waits on a child that holds stdout: the old runner read the pipe until
    # that child ended (130 s where the deadline said 30)
    cmd = Command(script(tmp_path, "echo restarting $1\necho waiting for it\nsleep 600"))
    rc, out, took = timed(cmd, "gpu0", "dflash-gpu0.service", 2.0, kill_grace=2.0)
    reap(pgid_of(tmp_path))
    assert rc == TIMED_OUT
    assert took < 2.0 + 2.0 + MARGIN_S
    assert "still running after 2 s" in out and out.endswith("restarting gpu0\nwaiting for it")
    assert group_members(pgid_of(tmp_path)) == []


def test_a_server_started_in_the_background_while_the_script_waits_is_ended_with_it(tmp_path, reap):
    # the script starts the "server" with & and no redirection, then waits for a health that never
    # comes; the server also ignores SIGTERM, so only the SIGKILL after the grace ends it
    body = ("sh -c 'trap \"\" TERM; echo server listening; while :; do sleep 1; done' &\n"
            "echo waiting for health\nwhile :; do sleep 1; done")
    cmd = Command(script(tmp_path, body))
    rc, out, took = timed(cmd, "gpu0", "dflash-gpu0.service", 2.0, kill_grace=1.0)
    reap(pgid_of(tmp_path))
    assert rc == TIMED_OUT and took < 2.0 + 2 * 1.0 + MARGIN_S
    assert "server listening" in out and "waiting for health" in out
    assert group_members(pgid_of(tmp_path)) == []


def test_a_background_server_left_by_a_successful_command_neither_hangs_nor_is_killed(tmp_path, reap):
    # the old runner read the pipe until the server ended: the rollout hung until it was killed
    body = "sh -c 'echo server listening; exec sleep 600' &\necho started $1\nexit 0"
    told = []
    cmd = Command(script(tmp_path, body), log_dir=tmp_path, progress=told.append)
    rc, out, took = timed(cmd, "gpu0", "dflash-gpu0.service", 300.0)
    pgid = pgid_of(tmp_path)
    reap(pgid)
    assert rc == 0 and "started gpu0" in out
    assert took < MARGIN_S  # its own process exited at once; the deadline is 300 s
    left = group_members(pgid)
    assert len(left) == 1  # the server runs on, writing into the kept log
    assert told[-1] == (f"gpu0: the restart command exited 0 and left 1 process(es) running in its group "
                        f"(pids {left[0]}) (its whole output: {tmp_path / 'restart-gpu0.log'})")
    assert "started gpu0" in (tmp_path / "restart-gpu0.log").read_text()


def test_a_stop_request_ends_the_whole_group_with_130(tmp_path, reap):
    started = tmp_path / "started"
    body = f"sleep 600 &\nsleep 600 &\necho both sleeping\ntouch {started}\nwait"
    cmd = Command(script(tmp_path, body))
    rc, out, took = timed(cmd, "gpu0", "dflash-gpu0.service", 300.0, started.exists, kill_grace=2.0)
    reap(pgid_of(tmp_path))
    assert rc == STOPPED and took < 2.0 + MARGIN_S
    assert out.startswith("stopped: the rollout was told to stop") and out.endswith("both sleeping")
    assert group_members(pgid_of(tmp_path)) == []


def test_progress_says_how_long_it_ran_and_its_last_line(tmp_path):
    # the script ends only once a progress line carried its output: no dependence on timing
    go = tmp_path / "go"
    body = f"echo loading weights\nwhile [ ! -f {go} ]; do sleep 0.1; done\necho ready"
    told = []

    def progress(text):
        told.append(text)
        if "loading weights" in text:
            go.touch()

    rc, out, _ = timed(Command(script(tmp_path, body)), "gpu0", "u", 300.0, progress=progress, progress_every=0.3)
    assert rc == 0 and out == "loading weights\nready"
    assert told and told[-1].startswith("gpu0: the restart command has run ")
    assert told[-1].endswith(" s; its last output: loading weights")


def test_a_failed_command_gives_its_status_and_the_end_of_its_output(tmp_path):
    body = "i=0; while [ $i -lt 40 ]; do echo line $i; i=$((i+1)); done\necho 'no such unit' >&2\nexit 3"
    rc, out, _ = timed(Command(script(tmp_path, body)), "gpu0", "u", 300.0)
    assert rc == 3
    assert out.splitlines() == [f"line {i}" for i in range(26, 40)] + ["no such unit"]


def test_a_missing_program_is_127():
    assert Command("/nonexistent/restart {name}").restart("gpu0", "u", 30.0) == \
        (127, "/nonexistent/restart: command not found")
