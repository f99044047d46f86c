"""`dflashctl rollout --restart-command` with the restart scripts that used to stop or hang a rollout.

One stand-in instance under the real supervisor (tests/rollout_harness.py), no router: what is
proven here is the restart command's deadline, not the router's part. Each script does the real
restart (tests/rollout_ctl.py) and then what broke the rollout before: a `sleep` holding the
command's output past `--ready-timeout` (the rollout stopped 100 s late), or a child left in the
background holding it after the command succeeded (the rollout hung until it was killed). Bounds
are wide (a loaded machine); a hang is ten minutes.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflashctl.errors import ROLLOUT_STOPPED
from dflashctl.service import config
from dflashctl.service.instance_control import KILL_GRACE_S, group_members
from rollout_harness import QUICK_CANARY, Supervisor, kill_groups, serve_argv
from router_harness import ENV, STANDIN, free_port

pytestmark = pytest.mark.slow
MARGIN_S = 60.0  # what a loaded machine may add: the canary before and after, the stand-in's start


@pytest.fixture
def one(tmp_path):
    sup = Supervisor(tmp_path)
    settings = tmp_path / "gpu0.json"
    settings.write_text(json.dumps({"name": "gpu0", "model": "standin-model", "port": free_port(config.MAX_PORT),
                                    "environment": {"STANDIN_READY_AFTER": "1.0", "STANDIN_TOKEN_DELAY": "0.002"}}))
    sup.add("gpu0", serve_argv(settings, STANDIN), dict(ENV, LOGS_DIRECTORY=str(tmp_path)))
    sup.serve_control().start_all()
    groups = []
    yield sup, settings, groups
    kill_groups(groups)  # whatever a failing test left behind
    sup.shutdown()


def rollout(tmp_path: Path, sup: Supervisor, settings: Path, body: str, *extra: str):
    """The rollout with a restart script: the real restart, then `body`; (rc, JSON, stderr, seconds, pgid)."""
    script = tmp_path / "restart.sh"
    script.write_text(f"cut -d' ' -f5 /proc/$$/stat > {tmp_path}/pgid\necho \"restarting $1\"\n"
                      f"{sup.restart_command.replace('{name}', '$1')}\n{body}\n")
    argv = [sys.executable, "-m", "dflashctl", "rollout", "--restart-command", f"sh {script} {{name}}",
            "--instance", str(settings), "--no-router", "--state-dir", str(tmp_path / "state"),
            "--healthy-for", "0", "--json", *QUICK_CANARY, *extra]
    t0 = time.monotonic()
    r = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr, took, \
        int((tmp_path / "pgid").read_text())


def test_a_sleep_holding_the_output_stops_the_rollout_at_the_ready_timeout(one, tmp_path):
    sup, settings, groups = one
    rc, result, err, took, pgid = rollout(tmp_path, sup, settings,
                                          'echo "restarted $1; waiting"\nsleep 600', "--ready-timeout", "15")
    groups.append(pgid)
    assert rc == ROLLOUT_STOPPED, err
    assert result["instances"][0]["outcome"] == "failed"
    assert took < 15 + 2 * KILL_GRACE_S + MARGIN_S  # not the sleep's 600 s
    assert group_members(pgid) == []  # the sleep too
    # while it ran, every 5 s: how long, and its last line (which one depends on the machine's pace)
    assert "gpu0: the restart command has run 5 s; " in err
    assert "restarting gpu0" in (tmp_path / "state" / "restart-gpu0.log").read_text()  # kept for the operator


def test_a_child_left_in_the_background_by_a_successful_restart_does_not_hang_it(one, tmp_path):
    sup, settings, groups = one
    rc, result, err, took, pgid = rollout(tmp_path, sup, settings, "sleep 600 &\necho started",
                                          "--ready-timeout", "300")
    groups.append(pgid)
    assert rc == 0, err
    assert result["instances"][0]["outcome"] == "done"
    assert took < MARGIN_S * 2  # the command returned at once; its child holds the output 600 s
    [left] = group_members(pgid)  # not ended: what a command starts in the background is its business
    assert f"left 1 process(es) running in its group (pids {left})" in err
    assert sup.instances["gpu0"].starts == 2  # the real restart happened


def test_ctrl_c_twice_ends_the_restart_commands_whole_group(one, tmp_path):
    # the first Ctrl-C lets the instance in progress finish; the second stops at once, and the command
    # (in a session of its own, so no terminal's Ctrl-C reaches it) must not be left running
    sup, settings, groups = one
    script = tmp_path / "restart.sh"
    script.write_text(f"cut -d' ' -f5 /proc/$$/stat > {tmp_path}/pgid\n{sup.restart_command.replace('{name}', '$1')}\n"
                      "sleep 600 &\nsleep 600\n")
    argv = [sys.executable, "-m", "dflashctl", "rollout", "--restart-command", f"sh {script} {{name}}",
            "--instance", str(settings), "--no-router", "--state-dir", str(tmp_path / "state"),
            "--healthy-for", "0", "--ready-timeout", "300", "--json"]
    p = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = ""
    for line in p.stderr:
        err += line
        if "gpu0: restarting (" in line:
            p.send_signal(signal.SIGINT)
        elif "got SIGINT: finishing" in line:
            t0 = time.monotonic()
            p.send_signal(signal.SIGINT)
            break
    out, rest = p.communicate(timeout=300)
    took = time.monotonic() - t0
    err += rest
    pgid = int((tmp_path / "pgid").read_text())
    groups.append(pgid)
    assert p.returncode == ROLLOUT_STOPPED, err
    assert json.loads(out)["status"] == "interrupted"
    assert took < KILL_GRACE_S + MARGIN_S
    assert group_members(pgid) == []  # both sleeps too
