"""serve's preflight in two parts (service/preflight.py): what SGLang must not start without first,
then the stack's imports (torch, sgl_kernel, ...) beside SGLang's own start, READY=1 after both.

The stack's interpreter is recorded_python.py (the H200's probe answers) with one answer changed per
test: a torch probe that answers only once the stand-in SGLang has started (its argv file), as a
probe slower than SGLang's start would; sequential checks would never see that file.
"""

import json
import os
import signal
import time

from h200_recordings import IDLE
from serve_fixture import NEVER, descendants

from dflashctl import errors
from dflashctl.host import gpus

def start(serve, stack_python, tmp_path, mode: str, changed: dict, **standin):
    answers = tmp_path / "changed-probes.json"
    answers.write_text(json.dumps(changed))
    return serve(mode, ["--python", stack_python], settings={"memFractionStatic": 0.5},
                 env={gpus.REPLAY_ENV: str(IDLE), "RECORDED_PROBES_CHANGED": str(answers)}, **standin)


def once_sglang_started(tmp_path, **fields) -> dict:
    return {"torch": {"wait_for": str(tmp_path / "argv.json"), **fields}}


TORCH_BROKEN = {"ok": False, "error": "ImportError: libtorch_cuda.so: undefined symbol: cudaGetDriverEntryPointByVersion"}


def statuses(proc) -> list[str]:
    proc.notify.drain()
    return [m for m in proc.notify.messages if m.startswith(("STATUS=", "READY=1"))]


def gone(pids: list[int], within: float = 10.0) -> bool:
    end = time.monotonic() + within  # a SIGKILL takes effect when the kernel next runs the process
    while time.monotonic() < end:
        if not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
                   for p in pids):
            return True
        time.sleep(0.05)
    return False


def command_words(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def test_the_stack_checks_run_beside_sglangs_start(serve, stack_python, tmp_path):
    proc = start(serve, stack_python, tmp_path, "healthy", once_sglang_started(tmp_path), ready_after=0.3)
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    said = statuses(proc)
    passed = [i for i, m in enumerate(said) if m.startswith("STATUS=preflight: ") and "checks passed" in m]
    started = [i for i, m in enumerate(said) if m.startswith("STATUS=starting SGLang")]
    assert started and passed and started[0] < passed[0] < said.index("READY=1"), said


def test_ready_waits_for_the_stack_checks(serve, stack_python, tmp_path):
    """SGLang decodes at once; torch's probe answers 2 s later: READY=1 only after it."""
    proc = start(serve, stack_python, tmp_path, "healthy", once_sglang_started(tmp_path, delay_s=2),
                 ready_after=0)
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]
    said = statuses(proc)
    passed = [i for i, m in enumerate(said) if "checks passed" in m]
    assert passed and passed[0] < said.index("READY=1"), said


def test_a_stack_check_failing_beside_the_start_stops_sglang_with_the_preflights_exit(serve, stack_python, tmp_path):
    pids = tmp_path / "children.json"  # the stand-in writes it once its scheduler and detokenizer run
    proc = start(serve, stack_python, tmp_path, "healthy", {"torch": {"wait_for": str(pids), **TORCH_BROKEN}},
                 listen_after=30, child_pidfile=pids)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_TORCH, err
    assert "preflight: 1 of " in err and "SGLang, started beside the stack's checks, was stopped" in err, err
    assert "torch does not import: ImportError: libtorch_cuda.so: undefined symbol" in err and "fix:" in err
    said = statuses(proc)
    assert "READY=1" not in said
    assert said[-1].startswith(f"STATUS=failed (exit {errors.PREFLIGHT_TORCH}): preflight: 1 of "), said[-1]
    children = json.loads(pids.read_text())
    assert len(children) == 2 and gone(list(children.values())), children  # scheduler and detokenizer too


def test_sglang_dying_of_what_a_stack_check_finds_is_reported_as_that_check(serve, stack_python, tmp_path):
    """SGLang's own import fails first (the stand-in logs an ImportError and exits 3); the torch
    probe, answering once that line is in SGLang's log, says why: serve reports the check, not a bare
    death."""
    died = {"wait_for": str(tmp_path / "sglang.log"), "containing": "standin: ImportError", "delay_s": 0.3}
    proc = start(serve, stack_python, tmp_path, "crash", {"torch": {**died, **TORCH_BROKEN}}, ready_after=0.1)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_TORCH, err
    assert "SGLang, started beside the stack's checks, had exited with status 3" in err, err
    assert "torch does not import" in err


def test_a_failure_before_the_start_still_names_the_stack_checks_and_starts_nothing(serve, stack_python, tmp_path):
    changed = {"driver": {"ok": False, "facts": {}, "error": "OSError: libnvidia-ml.so.1: cannot open shared "
                          "object file: No such file or directory"}, "torch": TORCH_BROKEN}
    proc = start(serve, stack_python, tmp_path, "healthy", changed)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_DRIVER, err  # the root cause's code: the driver's
    assert "SGLang was not started" in err and "1. driver:" in err and "torch does not import" in err, err
    assert not (tmp_path / "argv.json").exists()


def test_a_stop_while_the_stack_checks_run_ends_them_too(serve, stack_python, tmp_path):
    proc = start(serve, stack_python, tmp_path, "healthy",
                 {"torch": {"wait_for": str(tmp_path / "never")}}, ready_after=0)
    for _ in range(int(NEVER / 0.05)):
        if (tmp_path / "argv.json").exists():
            break
        time.sleep(0.05)
    probe = [p for p in descendants(proc.pid) if b"torch" in command_words(p)]
    assert probe, "the torch probe should still be waiting"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.OK, err
    assert "got SIGTERM; stopping SGLang" in err
    assert gone(probe), probe
