"""Busy GPUs found in seconds (host/gpus.py, service/gpu_claim.py): NVML read through the library
path it is given, recorded, replayed; serve refuses a GPU whose memory another process holds.

Without a GPU, NVML is either a recording (tests/data/gpus/h200-*.json: `doctor --record-nvml` on the
lent H200 by benchmarks/gpu/gpu_busy.sh, idle and with a torch process holding 120 GiB; the live
run's output is docs/gpu/gpu-busy.txt) or tests/data/gpus/fake_nvml.c built as libnvidia-ml.so.1,
which runs the real ctypes code; the processes it reports are real ones started here.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from h200_recordings import BUSY, DATA, IDLE
from serve_fixture import NEVER

from dflashctl import errors
from dflashctl.host import gpus, probes
from dflashctl.service import config, gpu_claim, sglang_0_5_11


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    """A directory holding the stand-in libnvidia-ml.so.1."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in NVML")
    d = tmp_path_factory.mktemp("nvml")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libnvidia-ml.so.1"), str(DATA / "gpus" / "fake_nvml.c")],
                   check=True)
    return d


@pytest.fixture
def holder():
    """A real process for NVML to name as the one holding GPU memory."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_nvml_is_read_through_the_library_path_it_is_given(fake_nvml, holder, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_PROCS", f"{holder.pid}:122880")
    monkeypatch.setenv("FAKE_NVML_UTIL", "100")
    r = probes.run_probe(sys.executable, "gpus", str(fake_nvml / "libnvidia-ml.so.1"))
    assert r["ok"], r
    snap = r["facts"]
    assert (snap["driver"], snap["cuda"], snap["library"]) == ("580.159.04", "13.0",
                                                                str(fake_nvml / "libnvidia-ml.so.1"))
    [gpu] = snap["gpus"]
    assert gpu["memory_mib"] == {"total": 143771, "used": 553 + 122880, "free": 143771 - 553 - 122880}
    assert gpu["utilization_percent"] == {"gpu": 100, "memory": 50}
    # NVML cannot name it (as in a PID namespace): the name comes from /proc
    assert gpu["processes"] == [{"pid": holder.pid, "name": sys.executable, "used_mib": 122880}]


def test_a_missing_library_is_a_finding_not_a_crash():
    r = probes.run_probe(sys.executable, "gpus", "/nonexistent/libnvidia-ml.so.1")
    assert not r["ok"] and "cannot open shared object file" in r["error"]
    check = gpu_claim.check_claim(r, [0], 0.5, "memFractionStatic 0.5")
    assert check.status == "warn" and check.summary.startswith("GPU memory not checked")


def test_doctor_shows_each_gpu_records_nvml_and_replays_it(fake_nvml, holder, tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_nvml), FAKE_NVML_PROCS=f"{holder.pid}:122880",
               FAKE_NVML_UTIL="100")
    env.pop(gpus.REPLAY_ENV, None)
    rec = tmp_path / "nvml.json"
    run = subprocess.run([sys.executable, "-m", "dflashctl", "doctor", "--json", "--record-nvml", str(rec)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert "Traceback" not in run.stderr, run.stderr
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    assert checks["driver"]["status"] == "ok"  # the stand-in answers the driver probe too
    assert checks["gpus"]["status"] == "warn"
    assert f"GPU 0: pid {holder.pid} {sys.executable} (120.0 GiB)" in checks["gpus"]["summary"]
    recording = gpus.load_recording(rec)
    assert recording["nvml"]["gpus"][0]["processes"][0]["pid"] == holder.pid
    # Replayed: no NVML at all, the same answers, and the table says where they came from.
    env = dict(os.environ, **{gpus.REPLAY_ENV: str(rec)})
    env.pop("LD_LIBRARY_PATH", None)
    table = subprocess.run([sys.executable, "-m", "dflashctl", "doctor"], env=env, capture_output=True,
                           text=True, timeout=180).stdout
    assert "gpu 0: NVIDIA H200, 20338 MiB free of 143771 MiB, 100 % busy, 1 compute process(es)" in table
    assert f"pid {holder.pid} {sys.executable}: 122880 MiB" in table
    assert f"(NVML answers replayed from {rec})" in table


def test_serve_refuses_a_busy_gpu_naming_the_holder(serve, stack_python):  # noqa: F811
    """The H200 with another process holding 120 GiB; the instance wants half the GPU. Replayed, serve
    names the holder in the words it used live on the H200 (docs/gpu/gpu-busy.txt)."""
    proc = serve("healthy", ["--python", stack_python], settings={"memFractionStatic": 0.5},
                 env={gpus.REPLAY_ENV: str(BUSY)})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_GPU_BUSY, err
    assert errors.PREFLIGHT_GPU_BUSY not in errors.NO_RESTART  # the other work may end: systemd retries
    assert ("GPU 0 (NVIDIA H200): 19.2 GiB free of 140.4 GiB, SGLang claims 70.2 GiB (memFractionStatic 0.5); "
            "held by pid 1968 python3 (120.6 GiB)\n") in err  # and no one else: the rest is the driver's
    # a lower memFractionStatic does not help there: SGLang's pool, free - (1 - f) x total, would be < 0
    assert "no memFractionStatic fits next to that work" in err
    assert not (proc.tmp / "argv.json").exists()  # SGLang was never started


def test_serve_starts_when_the_claim_fits(serve, stack_python):  # noqa: F811
    proc = serve("healthy", ["--python", stack_python], settings={"memFractionStatic": 0.5},
                 env={gpus.REPLAY_ENV: str(IDLE)})
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    proc.terminate()
    proc.communicate(timeout=NEVER)


def test_serve_names_a_live_holder_through_nvml(serve, stack_python, fake_nvml, holder):  # noqa: F811
    """No recording: NVML (the stand-in library) reports a real process; SGLang's default claim."""
    proc = serve("healthy", ["--python", stack_python],
                 env={"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_PROCS": f"{holder.pid}:40960"})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_GPU_BUSY, err
    assert "SGLang's default mem_fraction_static 0.903 for this GPU" in err
    assert f"held by pid {holder.pid} {sys.executable} (40.0 GiB)" in err


def snapshot(path: Path) -> dict:
    return {"ok": True, "facts": gpus.load_recording(path)["nvml"]}


def test_memory_no_listed_process_accounts_for_is_named():
    """In a container NVML lists no processes of other containers, yet their memory is used."""
    busy = snapshot(BUSY)
    busy["facts"]["gpus"][0]["processes"] = []
    check = gpu_claim.check_claim(busy, [0], 0.5, "memFractionStatic 0.5")
    assert check.exit_code == errors.PREFLIGHT_GPU_BUSY
    # all 124113 MiB used on the GPU: the holder's 123490 and the driver's own
    assert check.summary.endswith("held by processes NVML does not list here (another container or VM?): "
                                  "121.2 GiB")


def test_the_h200_recordings_replay_to_what_doctor_printed_there():
    """doctor's gpus check and per-GPU lines from the recordings equal those of the live runs on the
    H200 (docs/gpu/gpu-busy.txt). There NVML's pid was the holder's own (nested_pid_namespace false)
    and the recording names it python3; a replay takes the recorded name as it is."""
    idle = gpus.read("", env={gpus.REPLAY_ENV: str(IDLE)})
    check = gpus.doctor_check(idle)
    assert (check.status, check.summary) == ("ok", "GPU 0 139.8 GiB free of 140.4 GiB, no compute processes")
    assert gpus.render_lines(idle) == ["gpu 0: NVIDIA H200, 143155 MiB free of 143771 MiB, 0 % busy, "
                                       "0 compute process(es)", f"(NVML answers replayed from {IDLE})"]
    busy = gpus.read("", env={gpus.REPLAY_ENV: str(BUSY)})
    check = gpus.doctor_check(busy)
    assert (check.status, check.summary) == (
        "warn", "GPU 0 19.2 GiB free of 140.4 GiB — in use: GPU 0: pid 1968 python3 (120.6 GiB)")
    assert gpus.render_lines(busy) == ["gpu 0: NVIDIA H200, 19657 MiB free of 143771 MiB, 0 % busy, "
                                       "1 compute process(es)", "       pid 1968 python3: 123490 MiB",
                                       f"(NVML answers replayed from {BUSY})"]


def test_a_small_claim_next_to_the_holder_is_refused_by_sglangs_rule():
    """SGLang 0.5.11's pool is free - (1 - f) x total: 0.1 next to a 120 GiB holder leaves it below
    zero, so SGLang would stop with "Not enough memory" after loading the weights. Without
    allowSharedGpus no fraction fits both rules there; with it, the smallest one that SGLang fits."""
    check = gpu_claim.check_claim(snapshot(BUSY), [0], 0.1, "memFractionStatic 0.1")
    assert (check.status, check.exit_code) == ("fail", errors.PREFLIGHT_GPU_BUSY), check
    assert check.summary.startswith(
        "GPU 0 (NVIDIA H200): 19.2 GiB free of 140.4 GiB; SGLang's pool for weights and KV cache would be "
        "19.2 GiB free - (1 - 0.1) x 140.4 GiB = -107.2 GiB (memFractionStatic 0.1), so SGLang would stop "
        'with "Not enough memory"; held by pid 1968 python3')
    assert check.fix.startswith("no memFractionStatic fits on this GPU now")
    shared = gpu_claim.check_claim(snapshot(BUSY), [0], 0.1, "memFractionStatic 0.1", shared=True)
    assert shared.exit_code == errors.PREFLIGHT_GPU_BUSY
    assert shared.fix.startswith("set memFractionStatic to at least 0.87 plus the weights' share")


def test_a_shared_claim_that_fits_next_to_the_holder_is_a_warning():
    """The holder only held memory (0 % utilization): with allowSharedGpus, 0.9 leaves SGLang 5.2 GiB
    (19.2 GiB free - 0.1 x 140.4 GiB) and runs, with a warning naming the process it shares the GPU with."""
    check = gpu_claim.check_claim(snapshot(BUSY), [0], 0.9, "memFractionStatic 0.9", shared=True)
    assert (check.status, check.exit_code) == ("warn", 0), check
    assert check.summary == ("GPU 0 (NVIDIA H200): 19.2 GiB free of 140.4 GiB, SGLang claims 5.2 GiB "
                             "(memFractionStatic 0.9); GPU 0 is 0 % busy: pid 1968 python3 (120.6 GiB)")


def after_first_instance(fraction: float) -> dict:
    """The idle H200 once a first instance holds fraction x total (its pool) plus 2 GiB of context."""
    snap = snapshot(IDLE)
    mem = snap["facts"]["gpus"][0]["memory_mib"]
    held = int(fraction * mem["total"]) + 2048
    mem["free"] -= held
    mem["used"] += held
    snap["facts"]["gpus"][0]["processes"] = [{"pid": 4242, "name": "sglang::scheduler", "used_mib": held}]
    return snap


@pytest.mark.parametrize("first, second, fits", [
    (0.25, 0.25, False),  # seen twice on the H200: "Not enough memory"
    (0.2, 0.5, True),  # started one after the other on the H200: both ran
    (0.5, 0.5, False),
])
def test_two_instances_on_one_gpu_follow_sglangs_rule(first, second, fits):
    check = gpu_claim.check_claim(after_first_instance(first), [0], second, f"memFractionStatic {second:g}",
                             shared=True)
    assert (check.exit_code == 0) == fits, check
    if not fits:
        assert '"Not enough memory"' in check.summary and "sglang::scheduler" in check.summary
        least = float(check.fix.split("at least ")[1].split()[0])
        mem = after_first_instance(first)["facts"]["gpus"][0]["memory_mib"]
        assert sglang_0_5_11.pool_mib(mem["free"], mem["total"], least) > 0
        assert sglang_0_5_11.pool_mib(mem["free"], mem["total"], least - 0.01) <= 0


def test_a_gpu_the_host_lacks_is_a_settings_error():
    check = gpu_claim.check_claim(snapshot(IDLE), [0, 3], 0.5, "memFractionStatic 0.5")
    assert (check.status, check.exit_code) == ("fail", errors.CONFIG)
    assert check.summary == "GPU 3 not found: NVML sees 1 GPU(s) (0)"


def test_the_claim_is_memfractionstatic_or_sglangs_default():
    idle = gpus.load_recording(IDLE)["nvml"]
    cfg = config.from_dict({"name": "a", "model": "m", "memFractionStatic": 0.5})
    assert gpu_claim.claimed_fraction(cfg, idle, [0]) == (0.5, "memFractionStatic 0.5")
    # SGLang 0.5.11 on 143771 MiB: reserves 512 + 8192 x 1.5 + 256 x 2 + 128 + 58 piecewise graphs x 8
    # = 13904 MiB (>= 10 GiB), plus 4 GiB for a draft model with DFLASH.
    assert sglang_0_5_11.piecewise_graph_tokens(8192) == 58
    plain = config.from_dict({"name": "a", "model": "m"})
    assert gpu_claim.claimed_fraction(plain, idle, [0])[0] == round((143771 - 13904) / 143771, 3) == 0.903
    dflash = config.from_dict({"name": "a", "model": "m", "draftModel": "d", "speculative": {"algorithm": "DFLASH"}})
    assert gpu_claim.claimed_fraction(dflash, idle, [0])[0] == round((143771 - 13904 - 4096) / 143771, 3)


def test_instance_gpus_follow_gpus_then_visible_devices_then_tp_size():
    two = config.from_dict({"name": "a", "model": "m", "tpSize": 2})
    assert gpu_claim.instance_gpus(two, {}) == [0, 1]
    assert gpu_claim.instance_gpus(two, {"CUDA_VISIBLE_DEVICES": "3,5,6"}) == [3, 5]
    listed = config.from_dict({"name": "a", "model": "m", "gpus": [4]})
    assert gpu_claim.instance_gpus(listed, {"CUDA_VISIBLE_DEVICES": "4"}) == [4]


def test_a_file_that_is_not_a_recording_is_refused(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"gpus": []}')
    with pytest.raises(errors.DflashError) as e:
        gpus.load_recording(bad)
    assert "is not an NVML recording" in str(e.value) and "--record-nvml" in str(e.value)


def test_the_claim_reads_nvml_in_sglangs_environment(fake_nvml, monkeypatch):
    """On the H200 under the NixOS-layout emulation the check said "NVML gave no answers": it read
    NVML in serve's own environment, where a Nix-built Python finds no libnvidia-ml. It must read it
    where SGLang will run: the child environment driver discovery made."""
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.delenv(gpus.REPLAY_ENV, raising=False)
    cfg = config.from_dict({"name": "a", "model": "m/x", "gpus": [0], "memFractionStatic": 0.5})
    child_env = dict(os.environ, LD_LIBRARY_PATH=str(fake_nvml))  # what driver.provide hands SGLang
    check = gpu_claim.preflight_check(cfg, sys.executable, child_env)
    assert check.status == "ok", check
    assert "not checked" not in check.summary
