"""`dflashctl rollout` on loopback: the real router, the real supervisor, stand-in SGLang, under load.

Each instance is `dflashctl serve` (with the stand-in as its launcher) under tests/rollout_harness.py,
which does what systemd does for the unit (READY=1 through a notify socket, restart on failure but
not for errors.NO_RESTART); the rollout restarts instances through it with --restart-command, as a
host without systemd would (the systemd container tier runs the systemd path, test_systemd.py).
The router is sglang-router 0.3.2 as its unit runs it. Load is closed-loop JSON /generate through
the router; an independent poller reads the router's /workers every 0.1 s. Nothing is asserted
about time, only about what was answered, by whom, and what the router routed to.
"""

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from dflashctl.errors import CONFIG, ROLLOUT_BUSY, ROLLOUT_STOPPED
from dflashctl.operations import rollout_state
from rollout_harness import Rotation, serve_argv
from rollout_host import Host
from router_harness import ENV, STANDIN, Router, free_port, needs_router

pytestmark = [needs_router, pytest.mark.slow]


@pytest.fixture
def host(tmp_path):
    made = []

    def make(n: int = 4, router: bool = True, settings: dict | None = None, **env) -> Host:
        h = Host(tmp_path, n, settings, **env)
        made.append(h)  # stopped at the end even when its start fails half way
        return h.start(router)
    yield make
    for h in made:
        h.stop()


def failed(outcomes) -> list:
    return [o for o in outcomes if o.status != 200]


def down_windows(inst) -> list[tuple[float, float]]:
    """(exit, ready) of each restart from the supervisor's events."""
    out, exited = [], None
    for t, what in inst.events:
        if what.startswith("exit"):
            exited = t
        elif what == "ready" and exited is not None:
            out.append((exited, t))
            exited = None
    return out


def test_a_rollout_answers_every_request_and_restarting_all_at_once_does_not(host):
    h = host(4)
    with Rotation(h.router) as watch:
        load = h.load()
        assert load.wait_for(lambda o: len(o) >= 200, 30)
        rc, result, err = h.rollout()
        after = load.count()
        assert load.wait_for(lambda o: len(o) >= after + 200, 30)  # and served on after it
        rolled = load.stop()
    assert rc == 0, err
    assert [s["outcome"] for s in result["instances"]] == ["done"] * 4
    assert all(s["canary"]["verdict"] == "passed" for s in result["instances"])
    assert all(s["canary"]["outputs"] == {"verdict": "identical"} for s in result["instances"])
    assert h.state()["status"] == "done" and h.state()["left_out"] == {}
    assert failed(rolled) == [], failed(rolled)[:3]
    least = watch.least
    assert least >= 3 and result["min_in_rotation"] >= 3, (least, result)
    assert h.starts() == {f"gpu{i}": 2 for i in range(4)}  # each restarted once
    windows = sorted(w for inst in h.sup.instances.values() for w in down_windows(inst))
    assert len(windows) == 4 and all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows
    assert all(h.router.workers().values()) and len(h.router.workers()) == 4

    # The control: what a NixOS switch does today (every instance stopped, then started).
    load = h.load()
    assert load.wait_for(lambda o: len(o) >= 200, 30)
    assert all(ok for ok, _ in h.sup.restart_all())
    h.router.wait_healthy(h.urls)
    after = load.count()
    assert load.wait_for(lambda o: len(o) >= after + 200, 60)
    at_once = load.stop()
    print(f"rolling: {len(rolled)} requests, 0 failed, at least {least} in rotation; "
          f"all at once: {len(failed(at_once))} of {len(at_once)} failed")
    assert failed(at_once)  # the same load does see an outage


def test_batches_never_take_more_out_than_the_batch(host):
    h = host(4)
    with Rotation(h.router) as watch:
        load = h.load()
        rc, result, err = h.rollout("--batch", "2")
        outcomes = load.stop()
    assert rc == 0, err
    assert failed(outcomes) == []
    assert watch.least == 2 and result["min_in_rotation"] == 2, watch.samples  # two out at a time
    assert h.starts() == {f"gpu{i}": 2 for i in range(4)}


def test_a_build_whose_preflight_fails_stops_at_the_first_instance(host):
    h = host(4)
    for i, f in enumerate(h.files):  # the new version: the real preflight, on an interpreter without torch
        h.sup.define(f"gpu{i}", serve_argv(f, STANDIN, python=sys.executable, preflight=True))
    load = h.load()
    rc, result, err = h.rollout()
    outcomes = load.stop()
    assert rc == ROLLOUT_STOPPED, err
    first, *rest = result["instances"]
    assert first["outcome"] == "failed", first
    # serve's own verdict, through the supervisor: a preflight code (80-88: not restarted) and its list
    assert re.search(r"failed \(exit 8[0-8]\): preflight: \d+ of \d+ checks failed", first["error"]), first
    assert [s["outcome"] for s in rest] == ["not reached"] * 3
    assert h.starts() == {"gpu0": 2, "gpu1": 1, "gpu2": 1, "gpu3": 1}  # the others untouched
    assert failed(outcomes) == []
    assert h.router.workers() == {u: True for u in h.urls[1:]}  # the failed one stays out
    assert list(result["left_out"]) == ["gpu0"] and result["left_out"]["gpu0"].startswith(first["error"])
    assert first["step"] == "restart" and h.state()["status"] == "failed"
    assert "rollout failed" in err and "--resume" in err

    # Until it is dealt with, a plain rollout refuses; fixed, --resume starts with it.
    rc, _, err = h.rollout("--only", "gpu1")
    assert rc == ROLLOUT_STOPPED and "left instances out of the router" in err and "gpu0" in err, err
    for i, f in enumerate(h.files):  # rolled back
        h.sup.define(f"gpu{i}", serve_argv(f, STANDIN))
    rc, result, err = h.rollout("--resume", "--only", "gpu1")
    assert rc == 0, err
    assert [(s["name"], s["outcome"]) for s in result["instances"]] == [("gpu0", "done"), ("gpu1", "done")]
    assert "left out by the last rollout" in result["instances"][0]["why"]
    assert h.router.workers() == {u: True for u in h.urls}


@pytest.mark.parametrize("position", [0, 31])  # the first token, and the last of 32
def test_outputs_that_diverge_stop_it_unless_the_change_is_expected(host, position):
    h = host(2)
    h.edit(0, environment={"STANDIN_DIVERGE_FROM": str(position)})  # the new build of gpu0 decodes differently
    rc, result, err = h.rollout("--only", "gpu0")
    assert rc == ROLLOUT_STOPPED, err
    step = result["instances"][0]
    assert step["outcome"] == "failed" and step["step"] == "measure after", step
    assert step["canary"]["verdict"] == "failed"
    assert step["canary"]["outputs"]["first_divergence"]["prompt"] == 0
    assert step["canary"]["outputs"]["first_divergence"]["position"] == position
    assert f"first differs at token {position}" in step["error"] and "--canary-expect" in step["fix"]
    assert h.router.workers() == {h.urls[1]: True}
    assert h.starts() == {"gpu0": 2, "gpu1": 1}
    assert h.state()["status"] == "failed" and list(h.state()["left_out"]) == ["gpu0"]

    # Named as expected, the same difference passes with a note; judged against the reading from
    # before the first restart (kept in the state), and the instance goes back in.
    rc, result, err = h.rollout("--resume", "--only", "gpu0", "--canary-expect", "outputs")
    assert rc == 0, err
    canary = result["instances"][0]["canary"]
    assert canary["verdict"] == "passed" and canary["outputs"]["verdict"] == "differs", canary
    assert "the reading from before its first restart" in err
    assert h.router.workers() == {u: True for u in h.urls}


def test_an_instance_that_never_becomes_ready_stops_the_rollout(host):
    h = host(2)
    settings = json.loads(h.files[0].read_text())
    settings["environment"]["STANDIN_MODE"] = "hang"  # listens, never decodes
    h.files[0].write_text(json.dumps(settings))
    rc, result, err = h.rollout("--ready-timeout", "4")
    assert rc == ROLLOUT_STOPPED, err
    assert result["instances"][0]["outcome"] == "failed"
    assert "not ready 4 s after its restart" in result["instances"][0]["error"]
    assert result["instances"][1]["outcome"] == "not reached"
    assert h.router.workers() == {h.urls[1]: True}


def test_sigterm_finishes_the_instance_in_progress_and_stops(host, tmp_path):
    h = host(3, STANDIN_READY_AFTER="3")
    p = subprocess.Popen(h.argv(), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = ""
    for line in p.stderr:  # until the first instance is being restarted
        err += line
        if "gpu0: restarting" in line:
            break
    p.send_signal(signal.SIGTERM)
    out, rest = p.communicate(timeout=120)
    err += rest
    result = json.loads(out)
    assert p.returncode == ROLLOUT_STOPPED, err
    assert result["status"] == "interrupted"
    assert [s["outcome"] for s in result["instances"]] == ["done", "not reached", "not reached"]
    assert result["left_out"] == {}
    assert h.router.workers() == {u: True for u in h.urls}  # nothing left out of rotation
    assert h.starts() == {"gpu0": 2, "gpu1": 1, "gpu2": 1}


def test_a_second_sigterm_leaves_the_instance_out_and_says_so_for_resume(host):
    h = host(2, STANDIN_READY_AFTER="4")
    p = subprocess.Popen(h.argv(), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "gpu0: restarting" in line:
            break
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    result = json.loads(out)
    assert p.returncode == ROLLOUT_STOPPED, err
    assert result["instances"][0]["outcome"] == "interrupted"
    assert list(result["left_out"]) == ["gpu0"]  # said, and kept in the state for --resume
    assert "gpu0" in err and "--resume" in err
    assert h.urls[0] not in h.router.workers()
    rc, result, err = h.rollout("--resume", "--only", "gpu0")
    assert rc == 0, err
    assert h.router.workers() == {u: True for u in h.urls}


def test_the_router_restarting_mid_rollout(host):
    h = host(3, STANDIN_READY_AFTER="2")
    p = subprocess.Popen(h.argv(), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = ""
    for line in p.stderr:
        err += line
        if "gpu1: restarting" in line:
            break
    h.router.stop()
    h.router.start()  # same settings, as systemd restarts the unit: every worker configured again
    out, rest = p.communicate(timeout=180)
    err += rest
    result = json.loads(out)
    assert p.returncode == 0, err
    assert result["router_restarts"] >= 1
    assert [s["outcome"] for s in result["instances"]] == ["done"] * 3
    h.router.wait_healthy(h.urls)


def test_without_a_router_it_goes_one_at_a_time_and_says_the_ports_are_down(host):
    h = host(2, router=False)
    rc, result, err = h.rollout(router=False)
    assert rc == 0, err
    assert "own port is down while it restarts" in err
    assert h.starts() == {"gpu0": 2, "gpu1": 2}
    windows = sorted(w for inst in h.sup.instances.values() for w in down_windows(inst))
    assert windows[0][1] <= windows[1][0]


def test_dry_run_restarts_nothing(host):
    h = host(2)
    rc, result, err = h.rollout("--dry-run")
    assert rc == 0, err
    assert result["dry_run"] and [r["name"] for r in result["instances"]] == ["gpu0", "gpu1"]
    assert not (h.tmp / "state").exists()  # a dry run takes no lock and creates nothing
    assert h.starts() == {"gpu0": 1, "gpu1": 1}


# --- refusals before anything is touched (no instance is restarted) ---------------------------------

def test_a_second_rollout_is_refused_naming_the_running_one(host):
    h = host(1)
    with rollout_state.RolloutLock(h.tmp / "state") as lock:
        lock.write({"pid": 4242, "started": time.time(), "status": "running", "current": ["gpu0"],
                    "left_out": {}})
        rc, _, err = h.rollout()
    assert rc == ROLLOUT_BUSY, err
    assert "another rollout is running" in err and "pid 4242" in err and "gpu0" in err
    assert h.starts() == {"gpu0": 1}


def test_an_instance_not_behind_the_router_is_refused(host):
    h = host(2)
    assert h.router.sync(workers=[h.urls[0]]).returncode == 0  # gpu1 taken out of the router
    deadline = time.monotonic() + 20
    while h.urls[1] in h.router.workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    rc, _, err = h.rollout()
    assert rc == CONFIG, err
    assert "not behind the router: gpu1" in err and "router-unit" in err
    assert h.starts() == {"gpu0": 1, "gpu1": 1}


def test_an_unreachable_router_and_a_wrong_admin_key_are_refused(host, tmp_path):
    h = host(1)
    dead = {**h.router.settings, "port": free_port()}
    (tmp_path / "dead.json").write_text(json.dumps(dead))
    rc, _, err = h.rollout("--router", str(tmp_path / "dead.json"), "--router-wait", "1")
    assert rc == CONFIG and "cannot reach the router" in err and "--no-router" in err, err

    key = tmp_path / "admin-key"
    key.write_text("the-wrong-key\n")
    guarded = Router({"workers": h.urls, "adminApiKeyFile": str(tmp_path / "right-key")}, tmp_path)
    (tmp_path / "right-key").write_text("the-right-key\n")
    guarded.start()
    try:
        guarded.wait_healthy(h.urls, headers={"Authorization": "Bearer the-right-key"})
        (tmp_path / "guarded.json").write_text(json.dumps({**guarded.settings, "adminApiKeyFile": str(key)}))
        rc, _, err = h.rollout("--router", str(tmp_path / "guarded.json"))
    finally:
        guarded.stop()
    assert rc == CONFIG and "refused GET /workers" in err and "HTTP 401" in err, err
    assert h.starts() == {"gpu0": 1}


@pytest.mark.parametrize("args, fragment", [
    (["--batch", "0"], "--max-unavailable 0 is out of range"),
    (["--ready-timeout", "-1"], "--ready-timeout -1.0 is out of range"),
    (["--healthy-for", "nan"], "--healthy-for nan is out of range"),
    (["--canary-tokens", "1000000000"], "--canary-tokens 1000000000 is out of range"),
    (["--require-identical"], "--require-identical is gone"),
    (["--no-canary", "--canary-expect", "outputs"], "contradict each other"),
    (["--only", "gpu9"], "--only names no instance of this host: gpu9"),
    (["--restart-command", "true"], "--restart-command names no instance"),
    (["--restart-command", "'unbalanced"], "not a valid command line"),
])
def test_bad_arguments_are_refused_with_the_fix(host, args, fragment):
    h = host(1)
    rc, _, err = h.rollout(*args)
    assert rc == CONFIG and fragment in err and "Traceback" not in err, err
    assert h.starts() == {"gpu0": 1}
