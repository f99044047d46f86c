"""A failing GPU is named and taken out of rotation: GPU health in doctor, serve's preflight and the
running supervisor (host/gpu_health.py, host/gpu_watch.py, service/serve.py).

Without a failing GPU: the stand-in libnvidia-ml (tests/data/gpus/fake_nvml.c, built here) answers
from a scenario (tests/nvml_scenario.py): the H200 as recorded (tests/data/gpus/h200-health.json),
or that GPU lost, with a row remap pending or failed, uncorrected ECC errors, an XID after a delay,
a thermal slowdown, a PCIe x8 link. doctor, preflight and the supervisor read it through their own
ctypes code (probe_child.py) as on a real host; serve is the real `dflashctl serve` with a stand-in
SGLang, and the router test runs the real sglang-router in front of two real supervisors.
"""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashctl import errors
from dflashctl.host import fingerprint_diff, gpu_health, probes
from dflashctl.service import config
from nvml_scenario import HW_THERMAL, SW_THERMAL, Scenario, build_fake_nvml, recorded_gpu
from router_harness import ENV, STANDIN, Load, Router, free_port, generate_body, needs_router
from rollout_harness import Supervisor, serve_argv
from serve_fixture import NEVER

REPO = Path(__file__).resolve().parent.parent.parent
GOOD = json.loads((REPO / "docs" / "gpu" / "fingerprint-good.json").read_text())
LABEL = "GPU 0 (NVIDIA H200, GPU-27bbc8e0-0568-e561-28e8-624e377bec45, PCI 00000000:00:06.0)"


@pytest.fixture(scope="module")
def nvml(tmp_path_factory) -> Path:
    """The directory holding the stand-in libnvidia-ml.so.1."""
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


def nvml_env(nvml: Path, scenario: Scenario) -> dict:
    return {"LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_SCENARIO": str(scenario.path)}


def read(nvml: Path, scenario: Scenario) -> dict:
    """NVML's answers as doctor's `gpus` probe and serve's preflight read them."""
    return probes.run_probe(sys.executable, "gpus", str(nvml / "libnvidia-ml.so.1"),
                            env=dict(os.environ, **nvml_env(nvml, scenario)))


# (scenario, change, doctor/preflight verdict, words of the summary, words of the fix)
SCENARIOS = {
    "healthy": (lambda s: s, "ok", "no row remap pending or failed", ""),
    "lost": (lambda s: s.set("0.lost", 1), "fail", "NVML has lost this GPU", "nvidia-smi -r -i 0"),
    "remap-pending": (lambda s: s.set("0.remapped_rows.pending", 1).set("0.remapped_rows.uncorrectable", 1),
                      "fail", "a row remap is pending (0 row(s) remapped for correctable and 1 for uncorrectable",
                      "`nvidia-smi -r -i 0` (root), then start the instance again"),
    "remap-failed": (lambda s: s.set("0.remapped_rows.failure", 1).set("0.remapped_rows.uncorrectable", 3),
                     "fail", "a row remap failed", "replace the board (RMA)"),
    "uncorrected-ecc": (lambda s: s.set("0.ecc_errors.uncorrected_volatile", 2)
                        .set("0.ecc_errors.uncorrected_aggregate", 2),
                        "fail", "2 uncorrected ECC error(s) since the driver loaded or the GPU was last reset",
                        "drain it and reset it (`nvidia-smi -r -i 0`"),
    "ecc-history": (lambda s: s.set("0.ecc_errors.uncorrected_aggregate", 3), "warn",
                    "3 uncorrected ECC error(s) in the board's lifetime, none since the last reset", "dflashctl diff"),
    "thermal": (lambda s: s.set("0.clock_event_reasons", hex(SW_THERMAL | HW_THERMAL)).set("0.temperature_c", 91),
                "warn", "clocks held down: software thermal slowdown", "check the cooling"),
    "pcie-x8": (lambda s: s.set("0.pcie.width_current", 8), "warn",
                "PCIe gen 5 x8 (this slot and GPU: gen 5 x16): the link runs 8 of 16 lanes", "reseat the board"),
    "slow-link-busy": (lambda s: s.set("0.pcie.gen_current", 3).set("0.clock_event_reasons", "0x0"), "warn",
                       "below its generation while the GPU is busy", "reseat the board"),
    "slow-link-idle": (lambda s: s.set("0.pcie.gen_current", 1), "ok",
                       "idle: the link steps down to save power", ""),
    "reset-asked": (lambda s: s.set("0.recovery_action", 1), "fail",
                    "the driver asks for a GPU reset (GPU recovery action 1)", "nvidia-smi -r -i 0"),
}


def scenario(tmp_path: Path, name: str, gpus: int = 1) -> Scenario:
    return SCENARIOS[name][0](Scenario(tmp_path / f"{name}.nvml", gpus))


# --- the reading --------------------------------------------------------------------------------

def test_the_healthy_scenario_answers_every_figure_as_the_h200_recorded_it(nvml, tmp_path):
    r = read(nvml, scenario(tmp_path, "healthy"))
    assert r["ok"], r
    [gpu] = r["facts"]["gpus"]
    rec, health = recorded_gpu(), gpu["health"]
    assert (gpu["name"], gpu["uuid"]) == (rec["name"]["value"], rec["uuid"]["value"])
    assert health["pci"]["value"]["busId"] == rec["pci"]["value"]["busId"] == "00000000:00:06.0"
    for key in ("ecc_mode", "ecc_errors", "remapped_rows", "retired_pages", "retired_pages_pending",
                "clock_event_reasons", "clock_event_reasons_supported", "pcie", "temperature_c", "power_mw",
                "recovery_action"):
        assert health[key] == rec[key], key
    # The H200 answered NOT_SUPPORTED (3) for retired pages: it remaps rows instead
    assert rec["retired_pages"]["double_bit"] == {"rc": 3, "error": "NOT_SUPPORTED"}
    # the recovery action, recorded later by doctor on the H200: none asked for
    assert rec["recovery_action"] == {"rc": 0, "value": 0}
    h = gpu_health.assess(r["facts"])[0]
    assert h.status == "ok" and h.label == LABEL
    assert h.summary() == (f"{LABEL}: uncorrected ECC errors: 0 since the last reset, 0 in the board's lifetime; "
                           "corrected: 0 / 0; no row remap pending or failed (0 row(s) remapped for correctable "
                           "and 0 for uncorrectable errors); clock event reasons: idle (35 °C, 77 W); PCIe gen 5 "
                           "x16 (this slot and GPU: gen 5 x16)")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_scenario_gets_its_verdict_in_doctor_and_preflight(nvml, tmp_path, name):
    _, status, said, fix = SCENARIOS[name]
    r = read(nvml, scenario(tmp_path, name))
    assert r["ok"], r  # the driver answers, whatever the GPU does
    [check] = gpu_health.doctor_checks(r)
    assert (check.name, check.status) == ("gpu-health:0", status), check
    assert said in check.summary and fix in check.fix, check
    pre = gpu_health.preflight_check(r, [0])
    assert pre.status == status and said in pre.summary, pre
    assert pre.exit_code == (errors.PREFLIGHT_GPU_FAULT if status == "fail" else 0)
    if name != "lost":
        assert pre.summary.startswith(LABEL)  # named by index, UUID and PCI bus id


def test_a_lost_gpu_is_named_and_the_others_are_reported(nvml, tmp_path):
    """The issue's case: GPU 1 of two is lost. The driver check no longer fails for the whole host
    with "install NVIDIA driver >= 580"; GPU 0 is reported, GPU 1 fails by name."""
    s = Scenario(tmp_path / "s.nvml", gpus=2).set("1.lost", 1)
    env = dict(os.environ, **nvml_env(nvml, s))
    driver = probes.check_driver(probes.run_probe(sys.executable, "driver", env=env))
    assert driver.status == "ok", driver
    assert driver.summary.startswith("driver 580.159.04 (CUDA 13.0), 1 GPU: NVIDIA H200 (9.0, 143771 MiB); "
                                     "GPU 1 does not answer (GPU 1: GPU is lost (NVML error 15)")
    r = read(nvml, s)
    checks = {c.name: c for c in gpu_health.doctor_checks(r, expected=3)}
    assert checks["gpu-health:0"].status == "ok"
    assert checks["gpu-health:1"].status == "fail" and "NVML has lost this GPU" in checks["gpu-health:1"].summary
    # a GPU the host should have and NVML does not count (fell off, then the driver reloaded)
    assert checks["gpu-health:2"].status == "fail"
    assert checks["gpu-health:2"].summary == "GPU 2: NVML counts 2 GPU(s) (0, 1); GPU 2 is not among them"
    # an instance on GPU 0 starts; one on GPU 1 is refused
    assert gpu_health.preflight_check(r, [0]).status == "ok"
    assert gpu_health.preflight_check(r, [1]).exit_code == errors.PREFLIGHT_GPU_FAULT


def test_doctor_json_carries_the_raw_figures_and_diff_names_what_is_new(nvml, tmp_path):
    """`dflashctl doctor` over the real ctypes path, twice on one host: healthy, then GPU 1 lost and
    GPU 0 with new uncorrected errors. `dflashctl diff` says what got worse on the same boards."""
    runs = {}
    for name, s in (("before", Scenario(tmp_path / "a.nvml", gpus=2)),
                    ("after", Scenario(tmp_path / "b.nvml", gpus=2).set("1.lost", 1)
                     .set("0.ecc_errors.uncorrected_volatile", 1).set("0.ecc_errors.uncorrected_aggregate", 1))):
        env = dict(os.environ, **nvml_env(nvml, s))
        env.pop("DFLASHCTL_NVML_REPLAY", None)
        done = subprocess.run([sys.executable, "-m", "dflashctl", "doctor", "--json", "--save",
                               str(tmp_path / f"{name}.json")], env=env, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stderr, done.stderr
        runs[name] = json.loads(done.stdout)
    checks = {c["name"]: c for c in runs["after"]["checks"]}
    assert checks["driver"]["status"] == "ok"
    assert checks["gpu-health:0"]["status"] == "fail"
    assert "1 uncorrected ECC error(s)" in checks["gpu-health:0"]["summary"]
    assert checks["gpu-health:1"]["status"] == "fail"
    figures = checks["gpu-health:0"]["details"]["gpu"]["figures"]  # the raw figures, with NVML's codes
    assert figures["ecc_errors"]["uncorrected_volatile"] == {"rc": 0, "value": 1}
    assert runs["after"]["gpus"]["facts"]["unanswered"][0]["rc"] == 15
    done = subprocess.run([sys.executable, "-m", "dflashctl", "diff", str(tmp_path / "before.json"),
                           str(tmp_path / "after.json"), "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == errors.FAILED, done.stderr
    rows = {r["item"]: r for r in json.loads(done.stdout)["differences"] if r["group"] == "gpu-health"}
    assert rows["GPU 0 (GPU-27bbc8e0…) uncorrected ECC errors, lifetime"] == {
        "group": "gpu-health", "item": "GPU 0 (GPU-27bbc8e0…) uncorrected ECC errors, lifetime", "a": 0, "b": 1,
        "worse": True}
    assert rows["GPU 1 answers NVML"]["worse"] is True
    table = subprocess.run([sys.executable, "-m", "dflashctl", "diff", str(tmp_path / "before.json"),
                            str(tmp_path / "after.json")], capture_output=True, text=True, timeout=60).stdout
    assert "GPU health figures" in table and f"worse on this board since {tmp_path / 'before.json'}" in table


def test_between_hosts_the_figures_differ_without_being_new(nvml, tmp_path):
    """Two hosts' boards are not the same board: their counts are compared, nothing is 'new'."""
    a, b = copy.deepcopy(GOOD), copy.deepcopy(GOOD)
    a["gpus"] = read(nvml, Scenario(tmp_path / "a.nvml"))
    b["gpus"] = read(nvml, Scenario(tmp_path / "b.nvml").set("0.uuid", "GPU-other")
                     .set("0.ecc_errors.uncorrected_aggregate", 4))
    b["host"]["hostname"] = "gpu-2"
    rows = [r for r in fingerprint_diff.differences(a, b) if r["group"] == "gpu-health"]
    assert rows == [{"group": "gpu-health", "item": "GPU 0 uncorrected ECC errors, lifetime", "a": 0, "b": 4,
                     "worse": False}]


# --- what the running supervisor acts on ------------------------------------------------------------

# Pinned by value (docs/service.md's XID table says why each): the file the code reads must agree.
@pytest.mark.parametrize("xid, ends", [(48, True), (62, True), (64, True), (74, True), (79, True), (94, True),
                                       (95, True), (119, True), (120, True), (154, True),
                                       (13, False), (31, False), (43, False), (45, False), (63, False), (68, False),
                                       (92, False), (109, False), (140, False)])
def test_critical_xids_that_mean_the_gpu_failed_end_the_instance(xid, ends):
    f = gpu_health.xid_finding(xid, 0)
    assert (f.status == "fail") == ends, f
    assert f.what.startswith(f"XID {xid}: ")


def test_the_watch_figures_end_the_instance_on_new_uncorrected_errors_and_not_on_a_pending_remap():
    before = {"ecc_errors": {"uncorrected_volatile": {"rc": 0, "value": 0}},
              "remapped_rows": {"rc": 0, "value": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}},
              "recovery_action": {"rc": 3, "error": "NOT_SUPPORTED"}}
    assert gpu_health.watch_finding(before, before, 0) is None
    more = copy.deepcopy(before)
    more["ecc_errors"]["uncorrected_volatile"]["value"] = 2
    assert gpu_health.watch_finding(before, more, 0).status == "fail"
    pending = copy.deepcopy(before)
    pending["remapped_rows"]["value"].update(pending=1, uncorrectable=1)
    # nvml.h: "A pending remapping won't affect future work on the GPU" (containment, page offlining)
    assert gpu_health.watch_finding(before, pending, 0).status == "warn"
    failed = copy.deepcopy(before)
    failed["remapped_rows"]["value"]["failure"] = 1
    assert gpu_health.watch_finding(before, failed, 0).status == "fail"
    lost = {k: {"rc": 15, "error": "GPU_IS_LOST"} for k in before}
    assert gpu_health.watch_finding(before, lost, 0).key == "lost"


# --- serve's preflight ----------------------------------------------------------------------------------

def last_status(proc) -> str:
    proc.notify.drain()
    return [m for m in proc.notify.messages if m.startswith("STATUS=")][-1]


@pytest.mark.parametrize("name", ["lost", "remap-pending", "remap-failed", "uncorrected-ecc"])
def test_serve_refuses_a_faulty_gpu_naming_it_and_the_fix(serve, stack_python, nvml, tmp_path, name):  # noqa: F811
    _, _, said, fix = SCENARIOS[name]
    proc = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, scenario(tmp_path, name)))
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_GPU_FAULT, err
    assert errors.PREFLIGHT_GPU_FAULT in errors.NO_RESTART
    assert "1. gpu-health: GPU 0" in err and said in err and fix in err
    assert not (proc.tmp / "argv.json").exists()  # SGLang was never started
    status = last_status(proc)
    assert status.startswith("STATUS=failed (exit 89): preflight: ") and said in status and fix in status, status


@pytest.mark.parametrize("name", ["thermal", "pcie-x8"])
def test_a_slowdown_or_a_narrow_link_starts_the_instance_and_shows_in_its_status(
        serve, stack_python, nvml, tmp_path, name):  # noqa: F811
    _, _, said, _ = SCENARIOS[name]
    proc = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, scenario(tmp_path, name)))
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    warned = [m for m in proc.notify.messages if m.startswith("STATUS=preflight warning: gpu-health: ")]
    assert warned and said in warned[0], proc.notify.messages
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=NEVER)
    assert proc.returncode == 0


# --- the running supervisor -------------------------------------------------------------------------

def test_an_xid_79_while_serving_ends_the_instance_naming_the_gpu_and_the_restart_is_refused(
        serve, stack_python, nvml, tmp_path):  # noqa: F811
    """XID 79 once the instance is ready (the trigger file, not a delay: a loaded machine may take
    longer to start than any delay); from then on the GPU is lost for every process."""
    fell = tmp_path / "fell-off"
    s = Scenario(tmp_path / "s.nvml").xid(0, 79, fell, lost=1)
    proc = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, s))
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    ready = time.monotonic()
    fell.touch()
    _, err = proc.communicate(timeout=NEVER)
    ended = time.monotonic() - ready
    assert proc.returncode == errors.SERVER_GPU_FAILED, err
    assert errors.SERVER_GPU_FAILED not in errors.NO_RESTART  # restarted: the preflight decides
    assert f"{LABEL}: XID 79: the GPU has fallen off the bus (while serving); SGLang was stopped" in err
    assert "got signal 15" in (proc.tmp / "sglang.log").read_text()  # stopped, not left to hang
    status = last_status(proc)
    assert status.startswith(f"STATUS=failed (exit 94): {LABEL}: XID 79") and "power-cycle the host" in status
    print(f"XID 79 ended the instance {ended:.2f} s after it came (right after READY)")
    (proc.tmp / "notify.sock").unlink()
    again = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, s))  # what systemd's restart does
    _, err = again.communicate(timeout=NEVER)
    assert again.returncode == errors.PREFLIGHT_GPU_FAULT and "NVML has lost this GPU" in err, err


def test_an_uncontained_ecc_error_ends_the_instance_and_the_restart_names_the_errors(
        serve, stack_python, nvml, tmp_path):  # noqa: F811
    hit = tmp_path / "xid95"
    s = Scenario(tmp_path / "s.nvml").xid(0, 95, hit, ecc_errors__uncorrected_volatile=1,
                                          ecc_errors__uncorrected_aggregate=1, remapped_rows__uncorrectable=1,
                                          remapped_rows__pending=1)
    proc = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, s))
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    hit.touch()
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.SERVER_GPU_FAILED, err
    assert f"{LABEL}: XID 95: an uncontained uncorrectable ECC error" in err
    (proc.tmp / "notify.sock").unlink()
    again = serve("healthy", ["--python", stack_python], env=nvml_env(nvml, s))
    _, err = again.communicate(timeout=NEVER)
    assert again.returncode == errors.PREFLIGHT_GPU_FAULT, err
    assert "1 uncorrected ECC error(s) since the driver loaded" in err and "a row remap is pending" in err


def test_an_application_xid_is_noted_and_the_instance_serves_on(serve, nvml, tmp_path):  # noqa: F811
    hit = tmp_path / "xid43"
    s = Scenario(tmp_path / "s.nvml").xid(0, 43, hit)
    proc = serve("healthy", ["--skip-preflight"], env=nvml_env(nvml, s))
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    hit.touch()
    assert proc.notify.recv_until("XID 43", proc, timeout=20), proc.notify.messages
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=NEVER)
    assert proc.returncode == 0


def test_a_gpu_lost_while_loading_ends_the_start_naming_it(serve, nvml, tmp_path):  # noqa: F811
    s = Scenario(tmp_path / "s.nvml").xid(0, 79, tmp_path / "fell", delay_ms=500, lost=1)
    proc = serve("healthy", ["--skip-preflight"], env=nvml_env(nvml, s), ready_after=60)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.SERVER_GPU_FAILED, err
    assert f"{LABEL}: XID 79: the GPU has fallen off the bus (while starting)" in err
    assert not any("READY=1" in m for m in proc.notify.messages)


def test_without_nvml_the_watch_is_off_and_the_instance_serves(serve):  # noqa: F811
    proc = serve("healthy", ["--skip-preflight"], env={"LD_LIBRARY_PATH": "/nonexistent"})
    assert proc.notify.recv_until("READY=1", proc)
    assert any(m.startswith("STATUS=GPU watch: off: ") for m in proc.notify.messages), proc.notify.messages
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=NEVER)
    assert proc.returncode == 0


def test_the_watch_turned_off_in_the_settings_does_not_end_the_instance(serve, nvml, tmp_path):  # noqa: F811
    hit = tmp_path / "hit"
    s = Scenario(tmp_path / "s.nvml").xid(0, 79, hit, lost=1)
    proc = serve("healthy", ["--skip-preflight"], env=nvml_env(nvml, s),
                 settings={"environment": {"DFLASHCTL_GPU_WATCH": "0"}})
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    assert any("GPU watch: off: turned off (DFLASHCTL_GPU_WATCH=0)" in m for m in proc.notify.messages)
    hit.touch()
    assert not proc.notify.recv_until("exit 94", proc, timeout=3)  # nobody watches: it serves on
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=NEVER)
    assert proc.returncode == 0


# --- the router in front ----------------------------------------------------------------------------

@needs_router
@pytest.mark.slow
def test_the_other_instance_answers_every_request_while_one_gpu_fails(nvml, stack_python, tmp_path):  # noqa: F811
    """Two instances (GPU 0, GPU 1) under a supervisor that restarts them as systemd does, the real
    router in front, closed-loop JSON load. GPU 0 falls off the bus: its instance exits 94 naming
    it, its restart is refused (89, not restarted again), and every request is answered."""
    fell = tmp_path / "gpu0-fell-off"
    s = Scenario(tmp_path / "host.nvml", gpus=2).xid(0, 79, fell, lost=1)
    sup = Supervisor(tmp_path)
    urls = []
    for i in range(2):
        path = tmp_path / f"gpu{i}.json"
        path.write_text(json.dumps({"name": f"gpu{i}", "model": "standin-model", "gpus": [i],
                                    "port": free_port(config.MAX_PORT),
                                    "environment": {"STANDIN_READY_AFTER": "0.5", "STANDIN_TOKEN_DELAY": "0.002"}}))
        urls.append(config.load(path).base_url)
        sup.add(f"gpu{i}", serve_argv(path, STANDIN, python=stack_python, preflight=True),
                dict(ENV, LOGS_DIRECTORY=str(tmp_path), **nvml_env(nvml, s)))
    router = None
    try:
        sup.start_all()
        router = Router({"workers": urls}, tmp_path).start()
        router.wait_healthy(urls)
        load = Load(router.url + "/generate", generate_body(8), clients=8, max_requests=10**7, seconds=300).start()
        assert load.wait_for(lambda o: len(o) >= 200, 60)
        fell.touch()
        t0 = time.monotonic()
        sick = sup.instances["gpu0"]
        with sick.changed:
            assert sick.changed.wait_for(lambda: sick.state == "failed", timeout=120), sick.events
        down = time.monotonic() - t0
        after = load.count()
        assert load.wait_for(lambda o: len(o) >= after + 300, 60)  # served on by the other
        outcomes = load.stop()
    finally:
        if router:
            router.stop()
        sup.shutdown()
    failed = [o for o in outcomes if o.status != 200]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[0].status} {failed[0].error}"
    exits = [what for _, what in sick.events if what.startswith("exit")]
    assert exits == [f"exit {errors.SERVER_GPU_FAILED}", f"exit {errors.PREFLIGHT_GPU_FAULT}"], sick.events
    assert "NVML has lost this GPU" in sick.status_text and "nvidia-smi -r -i 0" in sick.status_text
    assert sup.instances["gpu1"].starts == 1  # the healthy one was never touched
    ports = {int(u.rsplit(":", 1)[1]) for u in urls}
    served_after = {o.worker for o in outcomes[after:]}
    assert served_after <= ports and len(served_after) == 1
    exited = next(t for t, what in sick.events if what == f"exit {errors.SERVER_GPU_FAILED}") - t0
    print(f"GPU 0 failed under load: {len(outcomes)} requests, 0 failed; its instance exited 94 {exited:.2f} s "
          f"after the XID and was refused again (89) {down:.1f} s after it")


# --- smoke: each GPU's health at the start and the end of the run -------------------------------------

def test_smoke_names_each_gpus_health_at_the_start_and_the_end(nvml, tmp_path):
    from smoke_runner import smoke
    s = Scenario(tmp_path / "s.nvml", gpus=2).set("1.pcie.width_current", 8)
    p = smoke(tmp_path, "--json", "result.json", DFLASHCTL_NVML_REPLAY="", **nvml_env(nvml, s))
    assert p.returncode == 0, p.stderr
    block = json.loads((tmp_path / "result.json").read_text())["gpu_health"]
    for when in ("start", "end"):
        assert [(g["index"], g["status"]) for g in block[when]["gpus"]] == [(0, "ok"), (1, "warn")], block[when]
        assert block[when]["gpus"][0]["uuid"] == "GPU-27bbc8e0-0568-e561-28e8-624e377bec45"
    assert "GPU health: at the start GPU 0 ok; GPU 1 warn: PCIe gen 5 x8" in p.stdout


def test_smoke_fails_when_its_gpu_is_faulty_at_the_end(nvml, tmp_path):
    from smoke_runner import smoke
    s = SCENARIOS["remap-failed"][0](Scenario(tmp_path / "s.nvml"))
    p = smoke(tmp_path, "--json", "result.json", DFLASHCTL_NVML_REPLAY="", **nvml_env(nvml, s))
    assert p.returncode == errors.FAILED, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["ok"]
    assert result["failures"] == [f"GPU health at the end of the run: {LABEL}: a row remap failed (0 row(s) "
                                  "remapped for correctable and 3 for uncorrectable errors): this memory can no "
                                  "longer repair itself (fix: replace the board (RMA); until then keep work off "
                                  "this GPU)"]


def test_a_gpu_that_fails_during_the_run_is_named_at_the_end(nvml, tmp_path, monkeypatch):
    """The start reading is the fingerprint's (taken as the servers start); the end one is read after."""
    from dflashctl.smoke import identity
    hit = tmp_path / "hit"
    s = Scenario(tmp_path / "s.nvml").xid(0, 95, hit, ecc_errors__uncorrected_volatile=1)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(nvml))
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(s.path))
    monkeypatch.delenv("DFLASHCTL_NVML_REPLAY", raising=False)
    ident = {"fingerprint": {"gpus": read(nvml, s)}}
    hit.touch()  # the run happens here
    block = identity.gpu_health_block(ident, sys.executable)
    assert block["start"]["gpus"][0]["status"] == "ok"
    assert block["end"]["gpus"][0]["status"] == "fail"
    assert identity.health_failures(block, 0)[0].startswith(
        f"GPU health at the end of the run: {LABEL}: 1 uncorrected ECC error(s) since the driver loaded")
    assert identity.health_failures(block, 3) == []  # not the smoke's GPU: reported, not failed
