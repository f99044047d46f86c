"""`dflashctl rollout` when the new build or the host is wrong: the canary, capacity, and faults.

The same loopback host as test_rollout.py (tests/rollout_host.py: the real router, `dflashctl serve`
under the supervisor, stand-in SGLang, closed-loop load through the router). The canary's builds
are the smoke's oracle pair decoded from its files (smoke/oracle.py): its broken drafter accepts
about one token a step where the good one accepts 16, with the same greedy outputs, as on the H200.
Each fault row checks the promise of the command: no traceback, the documented exit code, the
report (the JSON parses), a state file that tells the truth, every request through the router
answered, and `--resume` finishing the job. Nothing is asserted about time.
"""

import json
import re
import shlex
import signal
import sys
import time

import pytest
from rollout_host import Host
from router_harness import needs_router

from dflashctl.errors import CONFIG, ROLLOUT_STOPPED
from dflashctl.operations import canary
from dflashctl.smoke import oracle

pytestmark = [needs_router, pytest.mark.slow]


@pytest.fixture
def host(tmp_path):
    made = []

    def make(n: int = 2, settings: dict | None = None, **env) -> Host:
        h = Host(tmp_path, n, settings, **env)
        made.append(h)  # stopped at the end even when its start fails half way
        return h.start()
    yield make
    for h in made:
        h.stop()


def wait_until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def failed(outcomes) -> list:
    return [o for o in outcomes if o.status != 200]


def pair_host(host, tmp_path, step_delay: str) -> tuple[Host, oracle.Pair, dict]:
    """Two DFLASH instances of the oracle pair; the load asks what the pair's rule can continue."""
    good = oracle.write_pair(tmp_path / "models")
    bad = oracle.write_pair(tmp_path / "models", oracle.OracleShape(draft_offset_error=1))
    spec = {"model": str(good.target), "draftModel": str(good.draft), "skipTokenizerInit": True,
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16}}
    h = host(2, spec, STANDIN_STEP_DELAY=step_delay, STANDIN_TOKEN_DELAY="0")
    body = {"input_ids": canary.prompts(1)[0], "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    return h, bad, body


def stopped_at_first(h: Host, result: dict, step: str) -> dict:
    """The rollout stopped at gpu0's `step`: gpu1 never touched, gpu0 out with its reason, said everywhere."""
    first, second = result["instances"]
    assert first["outcome"] == "failed" and first["step"] == step, first
    assert second["outcome"] == "not reached" and second["step"] is None, second
    assert result["status"] == "failed" and result["error"]["exit_code"] == ROLLOUT_STOPPED
    assert result["error"]["why"] and result["error"]["fix"]
    state = h.state()
    assert state["status"] == "failed" and list(state["left_out"]) == ["gpu0"]
    assert state["instances"]["gpu0"] == {"outcome": "failed", "step": step}
    assert h.router.workers() == {h.urls[1]: True}
    return first


# --- the canary --------------------------------------------------------------------------------------

def test_a_drafter_that_accepts_less_stops_at_the_first_instance(host, tmp_path):
    h, bad, body = pair_host(host, tmp_path, "0.004")
    h.canary = ("--canary-tokens", "64")  # three repeats, the default thresholds
    for i in range(2):
        h.edit(i, draftModel=str(bad.draft))  # the new build: the drafter that reads one position off
    load = h.load(body, clients=4)
    rc, result, err = h.rollout()
    outcomes = load.stop()
    assert rc == ROLLOUT_STOPPED, err
    first = stopped_at_first(h, result, "measure after")
    assert re.search(r"acceptance length fell from 16 to 1\.\d+ \(0\.\d+x, below 0\.9x\)", first["error"]), first
    assert first["canary"]["outputs"] == {"verdict": "identical"}  # DFLASH stays lossless: only the figures tell
    assert first["canary"]["changed"]["drafter"]["speculative_draft_model_path"][1] == str(bad.draft)
    assert "--canary-expect drafter" in first["fix"]
    assert "failed, accept 16 -> 1." in err  # the journal's line
    assert h.starts() == {"gpu0": 2, "gpu1": 1}  # the second never restarted
    assert failed(outcomes) == [], failed(outcomes)[:3]
    assert "Traceback" not in err


def test_an_identical_build_passes_and_a_slower_one_stops_at_the_first_instance(host, tmp_path):
    h, _, body = pair_host(host, tmp_path, "0.02")
    h.canary = ("--canary-tokens", "64", "--canary-min-speed-ratio", "0.5")
    rc, result, err = h.rollout()
    assert rc == 0, err
    for s in result["instances"]:
        c = s["canary"]
        assert c["verdict"] == "passed" and c["decode_tps"]["judged"] and c["acceptance"]["ratio"] == 1.0, c
    for i in range(2):  # the new build: every forward pass four times as long (slower kernels)
        h.edit(i, environment={"STANDIN_STEP_DELAY": "0.08"})
    load = h.load(body, clients=4)
    rc, result, err = h.rollout()
    outcomes = load.stop()
    assert rc == ROLLOUT_STOPPED, err
    first = stopped_at_first(h, result, "measure after")
    assert re.search(r"decode speed fell from \d+ to \d+ tokens/s \(0\.\d+x, below 0\.5x\)", first["error"]), first
    assert first["canary"]["acceptance"]["ratio"] == 1.0 and first["canary"]["changed"] == {}
    assert h.starts() == {"gpu0": 3, "gpu1": 2}
    assert failed(outcomes) == [], failed(outcomes)[:3]


# --- capacity ----------------------------------------------------------------------------------------

def test_capacity_is_an_invariant_and_down_instances_go_first(host):
    h = host(3)
    remote = h.urls[2]
    h.files = h.files[:2]  # gpu2 is another host's worker behind the same router: not this host's
    rc, _, err = h.rollout("--batch", "2")
    assert rc == CONFIG and "would take all 2 of this host's instances out of rotation" in err, err
    assert "--max-unavailable 1" in err and h.starts() == {"gpu0": 1, "gpu1": 1, "gpu2": 1}

    for name in ("gpu1", "gpu2"):  # down: one of this host's, and the other host's worker
        h.sup._stop(h.sup.instances[name])
    assert wait_until(lambda: not any(h.router.workers().get(u) for u in h.urls[1:]), 60), h.router.workers()
    rc, _, err = h.rollout("--only", "gpu0")
    assert rc == CONFIG, err
    assert "would leave 0 of this host's 2 instances in rotation, fewer than 1" in err and "gpu1" in err, err
    assert h.starts() == {"gpu0": 1, "gpu1": 1, "gpu2": 1}

    rc, result, err = h.rollout()  # gpu1 first: restarting what is down costs no capacity
    assert rc == 0, err
    assert [s["name"] for s in result["instances"]] == ["gpu1", "gpu0"]
    assert result["instances"][0]["why"].startswith("not serving")
    assert f"other hosts out of rotation: {remote}" in err  # reported, not waited for
    assert h.starts() == {"gpu0": 2, "gpu1": 2, "gpu2": 1}
    assert result["min_in_rotation"] >= 1


# --- faults ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("says, error", [
    ("failed: exit 3: the new build does not start", r"the restart command failed \(exit 1\)"),
    ("failed: exit 94: gpu watch: XID 79 on GPU 0", r"its GPU is faulty \(exit 94: the GPU watch stopped it\)"),
])
def test_a_restart_command_that_fails(host, tmp_path, says, error):
    h = host(2)
    trigger = tmp_path / "fail-gpu0"
    trigger.write_text(says + "\n")
    real = h.sup.restart_command
    script = (f"if [ -e {tmp_path}/fail-{{name}} ]; then cat {tmp_path}/fail-{{name}}; exit 1; fi; "
              f"exec {real}")
    h.restart_command = "sh -c " + shlex.quote(script)
    load = h.load()
    rc, result, err = h.rollout()
    outcomes = load.stop()
    assert rc == ROLLOUT_STOPPED and "Traceback" not in err, err
    first = stopped_at_first(h, result, "restart")
    assert re.search(error, first["error"]), first
    assert "journalctl" not in first["fix"] + first["error"]  # no systemd here
    assert failed(outcomes) == []

    trigger.unlink()
    rc, result, err = h.rollout("--resume")
    assert rc == 0, err
    assert [(s["name"], s["outcome"]) for s in result["instances"]] == [("gpu0", "done"), ("gpu1", "done")]
    assert h.router.workers() == {u: True for u in h.urls} and h.state()["status"] == "done"


def test_an_instance_that_answers_the_canary_with_errors(host):
    h = host(2)
    h.edit(0, environment={"STANDIN_CONTEXT": "8"})  # the new build: HTTP 400 to every canary prompt (16 tokens)
    load = h.load()
    rc, result, err = h.rollout()
    outcomes = load.stop()
    assert rc == ROLLOUT_STOPPED and "Traceback" not in err, err
    first = stopped_at_first(h, result, "measure after")
    assert "canary request(s) failed after the restart" in first["error"] and "HTTP 400" in first["error"], first
    assert failed(outcomes) == []

    h.edit(0, environment={"STANDIN_CONTEXT": "4096"})  # fixed
    rc, result, err = h.rollout("--resume")
    assert rc == 0, err
    assert [(s["name"], s["outcome"]) for s in result["instances"]] == [("gpu0", "done"), ("gpu1", "done")]
    assert h.router.workers() == {u: True for u in h.urls}


def lines_until(p, text: str) -> str:
    seen = ""
    for line in p.stderr:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"the rollout ended before {text!r}: {seen}")


def test_the_router_gone_for_good_during_the_hold(host):
    h = host(2)
    load = h.load()
    p = h.popen("--healthy-for", "5", "--router-wait", "2")
    err = lines_until(p, "gpu0: back in rotation")
    h.router.stop()
    out, rest = p.communicate(timeout=180)
    err += rest
    outcomes = load.stop()
    assert p.returncode == ROLLOUT_STOPPED and "Traceback" not in err, err
    result = json.loads(out)
    first = result["instances"][0]
    assert first["outcome"] == "failed" and first["step"] == "hold", first
    assert "the router stayed unreachable for 2 s" in first["error"]
    assert result["instances"][1]["outcome"] == "not reached"
    assert h.state()["status"] == "failed" and list(h.state()["left_out"]) == ["gpu0"]
    # every request the router answered before it went was answered
    assert all(o.status in (200, 0) for o in outcomes), failed(outcomes)[:3]

    h.router.start()
    h.router.wait_healthy(h.urls)
    rc, result, err = h.rollout("--resume")
    assert rc == 0, err
    assert [(s["name"], s["outcome"]) for s in result["instances"]] == [("gpu0", "done"), ("gpu1", "done")]


def test_sigterm_then_sigkill_and_resume_restart_nothing_twice(host):
    h = host(3)
    p = h.popen()
    lines_until(p, "gpu0: restarting")
    p.send_signal(signal.SIGTERM)  # the first finishes gpu0 and stops
    out, err = p.communicate(timeout=180)
    result = json.loads(out)
    assert p.returncode == ROLLOUT_STOPPED and "Traceback" not in err, err
    assert [s["outcome"] for s in result["instances"]] == ["done", "not reached", "not reached"]
    assert result["error"]["exit_code"] == ROLLOUT_STOPPED
    state = h.state()
    assert state["status"] == "interrupted" and list(state["done"]) == ["gpu0"] and state["left_out"] == {}

    p = h.popen()  # a re-run goes on from there: gpu0 is not restarted again
    lines_until(p, "gpu1: restarting")
    p.kill()  # SIGKILL: nothing can be written now
    p.wait()
    state = h.state()
    assert state["status"] == "running" and list(state["left_out"]) == ["gpu1"] and list(state["done"]) == ["gpu0"]

    rc, result, err = h.rollout("--resume")
    assert rc == 0, err
    assert [s["name"] for s in result["instances"]] == ["gpu1", "gpu2"]
    assert [u["name"] for u in result["up_to_date"]] == ["gpu0"]
    assert h.state()["status"] == "done"
    starts = h.starts()  # gpu0 once; gpu1 by --resume (and by the killed run, if its restart command got that far)
    assert starts["gpu0"] == 2 and starts["gpu2"] == 2 and starts["gpu1"] in (2, 3), starts
    assert h.router.workers() == {u: True for u in h.urls}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
