"""The rollout's fault matrix, every cell: each step (take out ... hold) x each fault (the router gone
for good, a dflashctl error from what the step calls, an OS error such as a full disk, a bug, Ctrl-C).

The loopback tests (test_rollout_faults.py, test_rollout.py) run the chosen cells end to end with the
real router and stand-ins; here the rollout's state machine (operations/rollout_machine.py) runs
against fakes of the router's admin API, the instances and the restart command, so that the fault
fires exactly inside the step named, and every cell is checked for the same promise: no exception
escapes, the report is the command's (exit 7, the one JSON object), the instance's outcome names the
step it failed or was interrupted at, the instances after it are not reached, and the state file
says what --resume needs (who is out of the router, why, and whether it still runs its old build).
"""

import json

import pytest

from dflashctl.errors import ROLLOUT_STOPPED, DflashError
from dflashctl.operations import canary, rollout, rollout_machine, rollout_state
from dflashctl.operations.canary import CanarySettings, Reading
from dflashctl.operations.rollout_plan import Plan, Target
from dflashctl.operations.router_admin import RouterUnreachable, Worker
from dflashctl.service import config

STEPS = rollout_machine.STEPS
BEFORE_RESTART = ("take out", "drain", "measure before")
# The first step at or after each where the router is asked something (the others talk to the instance).
ROUTER_NOTICED = {"take out": "take out", "drain": "put back", "measure before": "put back",
                  "restart": "put back", "ready": "put back", "measure after": "put back",
                  "put back": "put back", "hold": "hold"}
FAULTS = {
    "router gone for good": lambda: RouterUnreachable("the router does not answer", "connection refused",
                                                      "start it"),
    "dflashctl error": lambda: DflashError("systemctl show failed", "Failed to connect to bus",
                                           "run it where systemd runs"),
    "full disk": lambda: OSError(28, "No space left on device"),
    "bug": lambda: RuntimeError("an unexpected state"),
    "Ctrl-C": lambda: KeyboardInterrupt(),
}


class Host:
    """Two instances behind a router, all fakes; `fault` fires at the first call made while gpu0 is at
    `step` (the router gone for good: at every router call from then on)."""

    def __init__(self, step: str, fault: str):
        self.step, self.fault = step, fault
        self.cfgs = [config.from_dict({"name": f"gpu{i}", "model": "/models/target", "port": 31000 + i,
                                       "gpus": [i]}) for i in range(2)]
        self.routed = {c.base_url: True for c in self.cfgs}
        self.router_gone = False
        self.rollout: rollout_machine.Rollout | None = None
        self.calls: list[tuple[str, str]] = []

    def at_step(self) -> bool:
        return self.rollout is not None and self.rollout.steps["gpu0"].step == self.step

    def call(self, who: str, what: str) -> None:
        """Every fake's first line: note the call, and raise the fault where it belongs."""
        self.calls.append((self.rollout.steps["gpu0"].step if self.rollout else None, what))
        if self.fault == "router gone for good":
            self.router_gone = self.router_gone or self.at_step()
            if who == "router" and self.router_gone:
                raise FAULTS[self.fault]()
        elif self.at_step():
            raise FAULTS[self.fault]()

    # the router's admin API (RouterAdmin)
    def workers(self):
        self.call("router", "workers")
        return [Worker(f"id-{u}", u, ok) for u, ok in self.routed.items()]

    def remove(self, url):
        self.call("router", "remove")
        self.routed.pop(url, None)
        return True

    def add(self, url):
        self.call("router", "add")
        self.routed[url] = True

    def wait_listed(self, url, healthy, timeout, poll=0.25):
        self.call("router", "wait_listed")
        return (url in self.routed) == healthy

    # the restart command (instance_control.RestartCommand)
    def restart(self, name, unit, timeout, give_up):
        self.call("control", "restart")
        return 0, "restarted"

    def argv(self, name, unit):
        return ["restart", name]

    def log_path(self, name):
        return None

    # the instances (operations/canary.py)
    def decodes(self, base_url, api_key, timeout=60.0):
        self.call("instance", "decodes")
        return True

    def in_flight(self, base_url, api_key):
        self.call("instance", "requests_in_flight")
        return 0

    def measure(self, base_url, api_key, settings, say=None, **kw):
        self.call("instance", "measure")
        return Reading({"model": {"path": "/models/target"}}, [[1, 2, 3]], accept_length=8.0, decode_tps=100.0,
                       decode_tps_repeats=[100.0], prompts=1, tokens=3, repeats=1)


@pytest.fixture
def rolled(tmp_path, monkeypatch):
    def run(step: str, fault: str):
        h = Host(step, fault)
        monkeypatch.setattr(canary, "decodes", h.decodes)
        monkeypatch.setattr(canary, "decodes_now", h.decodes)
        monkeypatch.setattr(canary, "requests_in_flight", h.in_flight)
        monkeypatch.setattr(canary, "measure", h.measure)
        monkeypatch.setattr(rollout_machine.time, "sleep", lambda s: None)
        plan = Plan([Target(c, "its unit changed") for c in h.cfgs], [], 1, h.cfgs)
        opts = rollout_machine.Options(canary=CanarySettings(prompts=1, tokens=3, repeats=1), healthy_for=0.05,
                                       ready_timeout=5, drain_timeout=1, wait_others=1, router_wait=0)
        with rollout_state.RolloutLock(tmp_path / "state") as lock:
            h.rollout = rollout_machine.Rollout(plan, h, 0, h, opts, lock, {}, {c.name: "new" for c in h.cfgs})
            status = h.rollout.run(lambda t: None, floor=1)
            with pytest.raises(DflashError) as stopped:  # cli.main turns it into the exit code, adding no JSON
                rollout.report(h.rollout, status, 1.0, as_json=True)
            return h, status, stopped.value.exit_code, lock.read()
    return run


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("step", STEPS)
def test_every_step_and_fault_ends_in_a_report_and_a_state_that_tell_the_truth(rolled, capsys, step, fault):
    h, status, code, state = rolled(step, fault)
    assert any(at == step for at, _ in h.calls), h.calls  # the step asked something: the fault fired in it
    out, err = capsys.readouterr()
    report = json.loads(out)  # the one JSON object
    assert "Traceback" not in err
    assert code == ROLLOUT_STOPPED == report["exit_code"] == report["error"]["exit_code"]
    gpu0, gpu1 = report["instances"]
    assert gpu1["outcome"] == "not reached" and gpu1["step"] is None  # the rest never saw the new build
    assert state["instances"]["gpu1"] == {"outcome": "not reached", "step": None}
    assert "gpu1" not in state["left_out"] and "gpu1" not in state["done"]
    if fault == "Ctrl-C":
        assert status == state["status"] == report["status"] == "interrupted"
        assert gpu0["outcome"] == "interrupted" and gpu0["step"] == step
        assert report["error"]["fix"] == "run `dflashctl rollout --resume` to continue"
        assert "gpu0" not in state["done"]  # its hold never finished: --resume proves it again
        if step == "hold":  # back in rotation already, on the new build
            assert state["left_out"] == {} and h.cfgs[0].base_url in h.routed
        else:
            assert state["left_out"]["gpu0"] == {**state["left_out"]["gpu0"], "reason": f"interrupted at {step}",
                                                 "step": step}
        return
    assert list(state["left_out"]) == ["gpu0"] and state["left_out"]["gpu0"]["url"] == h.cfgs[0].base_url
    reason = state["left_out"]["gpu0"]["reason"]
    failed_at = ROUTER_NOTICED[step] if fault == "router gone for good" else step
    assert status == state["status"] == report["status"] == "failed"
    assert gpu0["outcome"] == "failed" and gpu0["step"] == failed_at, gpu0
    assert state["instances"]["gpu0"] == {"outcome": "failed", "step": failed_at}
    assert gpu0["error"].startswith("gpu0: ") and gpu0["fix"].endswith("`dflashctl rollout --resume`")
    assert reason.endswith(f"(at {failed_at}, before its restart: it runs its old definition)"
                           if failed_at in BEFORE_RESTART else f"(at {failed_at})")
    assert report["error"]["why"].startswith("left out of rotation: gpu0 (why: above, and in ")
    said = {"router gone for good": "the router stayed unreachable for 0 s",
            "dflashctl error": "systemctl show failed: Failed to connect to bus",
            "full disk": "No space left on device",
            "bug": "RuntimeError: an unexpected state"}[fault]
    assert said in gpu0["error"] and said in report["error"]["what"], gpu0
    if fault == "bug":
        assert "this is a dflashctl bug: report it" in gpu0["fix"]
    if failed_at == "hold" and fault != "router gone for good":  # out of the router again, or said why not
        assert h.cfgs[0].base_url not in h.routed or "gpu0: could not take it out of the router again: " in err
    assert state["done"] == {}
