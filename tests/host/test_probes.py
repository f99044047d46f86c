"""The probe runner with real child processes: crashes, hangs and missing interpreters are findings."""

import os
import sys

import pytest

from dflashctl import errors
from dflashctl.host import probes


def test_a_crashing_child_is_a_finding_with_its_stderr():
    r = probes.run_probe(sys.executable, "crash")
    assert not r["ok"]
    assert r["error"] == "crashed: killed by SIGABRT"
    assert r["returncode"] == -6


def test_a_hanging_child_is_killed_at_the_timeout():
    r = probes.run_probe(sys.executable, "hang", timeout=1.0)
    assert not r["ok"] and r["timed_out"]
    assert r["error"] == "timed out after 1 s (killed)"


def test_a_missing_interpreter_is_a_finding():
    r = probes.run_probe("/nonexistent/python3", "python")
    assert not r["ok"] and r["error"].startswith("cannot run /nonexistent/python3")


def test_an_import_error_keeps_what_the_probe_learnt_before_it():
    # This test venv has no torch: the probe reports the error, the parent turns it into a Check.
    r = probes.run_probe(sys.executable, "torch")
    assert not r["ok"] and "No module named 'torch'" in r["error"]
    check = probes.check_torch(r)
    assert (check.status, check.summary, check.exit_code) == ("fail", "torch is not installed",
                                                               errors.PREFLIGHT_TORCH)


def test_library_output_cannot_corrupt_the_result():
    # The python probe prints nothing, but the child's fd 1 is stderr: anything printed goes there.
    r = probes.run_probe(sys.executable, "python")
    assert r["ok"] and r["facts"]["executable"]


def test_preflight_on_a_host_without_the_stack_fails_on_the_root_cause():
    checks = probes.preflight("none", "DFLASH", timeout=60)
    names = [c.name for c in checks]
    assert names == ["driver", "libcuda", "libnuma", "torch", "sgl_kernel", "grammar:none", "soundfile", "sglang"]
    by_name = {c.name: c for c in checks}
    assert by_name["grammar:none"].status == "warn"
    assert by_name["sglang"].status == "fail" and by_name["sglang"].exit_code == errors.PREFLIGHT_SGLANG
    assert all(c.exit_code in errors.NO_RESTART for c in checks if c.status == "fail")


def test_the_preflights_two_parts_split_its_checks_in_order():
    """serve reads the checks SGLang must not start without, then the stack's (service/preflight.py):
    together they are the whole preflight, in its root-cause order, each check once."""
    import json
    from pathlib import Path
    answers = json.loads((Path(__file__).parent.parent / "data" / "service" / "h200-probes.json").read_text())
    for grammar in ("xgrammar", "none"):
        whole = [c.name for c in probes.preflight_checks(answers, grammar, "DFLASH")]
        first = probes.preflight_checks(answers, grammar, "DFLASH", only=probes.BEFORE_START)
        beside = probes.preflight_checks(answers, grammar, "DFLASH", leave_out=probes.BEFORE_START)
        assert [c.name for c in first + beside] == whole
        assert [c.name for c in first] == ["driver", "libcuda", "libnuma"]
        wanted = probes.preflight_probes(grammar, "DFLASH")
        assert probes.probe_keys(wanted, probes.BEFORE_START) == ["driver", "libcuda", "libnuma"]
    # what gates SGLang's start reads no module of the stack: no probe of it imports torch
    assert {probes.preflight_probes("none", None)[k][0] for k in probes.BEFORE_START} == {"driver", "native"}


def test_preflight_refuses_an_unknown_grammar_backend():
    try:
        probes.preflight("regexy", None)
    except errors.DflashError as e:
        assert e.exit_code == errors.CONFIG
    else:
        raise AssertionError("an unknown backend was accepted")


def _lock_for_python(tmp_path, version: str):
    """The real lock, claiming to be for CPython `version` (doctor's fixes depend on it)."""
    import json
    from pathlib import Path
    data = json.loads((Path(__file__).parent.parent.parent / "nix/python-lock.json").read_text())
    path = tmp_path / f"lock-{version}.json"
    path.write_text(json.dumps({**data, "python": version}))
    return path


def _doctor_packages_fix(tmp_path, lock) -> tuple[dict, str]:
    import json
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "dflashctl", "doctor", "--json",
                           "--lock", str(lock), "--save", str(tmp_path / "fp.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == errors.FAILED, proc.stderr
    assert "Traceback" not in proc.stderr
    fp = json.loads(proc.stdout)
    assert fp == json.loads((tmp_path / "fp.json").read_text())
    checks = {c["name"]: c for c in fp["checks"]}
    assert checks["torch"]["summary"] == "torch is not installed"
    assert checks["sglang"]["status"] == "fail"
    return checks, checks["packages"]["fix"]


def test_doctor_on_a_python_without_the_stack_says_so_and_its_install_hint_runs(tmp_path):
    """This test venv has no torch, no SGLang, no GPU: doctor reports it as checks, not a crash, and
    the packages check's fix is a command that works as printed (export writes the file pip reads),
    here where the Python is the lock's."""
    import shlex
    import subprocess
    from pathlib import Path

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    _, fix = _doctor_packages_fix(tmp_path, _lock_for_python(tmp_path, here))
    export, install = fix.split(": ", 1)[1].split(" && ")
    argv = shlex.split(export)
    assert argv[:2] == ["dflashctl", "export"]
    out = Path(argv[argv.index("-o") + 1])
    argv[argv.index("-o") + 1] = str(tmp_path / "req.txt")
    subprocess.run([sys.executable, "-m", "dflashctl", *argv[1:]], check=True, capture_output=True)
    lines = [ln for ln in (tmp_path / "req.txt").read_text().splitlines() if not ln.startswith("#")]
    assert lines and all(" --hash=sha256:" in ln for ln in lines)
    python, *rest = shlex.split(install)
    assert os.path.samefile(python, sys.executable)
    assert rest == ["-m", "pip", "install", "--no-deps", "--require-hashes", "-r", str(out)]


def test_doctor_on_another_python_than_the_locks_says_it_cannot_hold_the_stack(tmp_path):
    """Issue 34, finding 4: on a Python other than the lock's, pip picks other wheels than the lock's
    hashes allow ("THESE PACKAGES DO NOT MATCH THE HASHES"), so the fix must not be to pip-install
    into this Python: it names a new environment with the lock's Python, and its export runs."""
    import shlex
    import subprocess

    checks, fix = _doctor_packages_fix(tmp_path, _lock_for_python(tmp_path, "3.99"))
    here = ".".join(map(str, sys.version_info[:3]))
    assert checks["python"]["status"] == "fail"
    assert fix.startswith(f"this Python ({here}) cannot hold the stack: the lock's wheels are for CPython 3.99")
    assert f"{sys.executable} -m pip" not in fix  # never into this interpreter
    command = fix.split("`")[1]
    venv, export, install = command.split(" && ")
    assert venv == "python3.99 -m venv /opt/dflash"
    assert shlex.split(install)[:2] == ["/opt/dflash/bin/pip", "install"]
    argv = shlex.split(export)
    argv[argv.index("-o") + 1] = str(tmp_path / "req.txt")
    subprocess.run([sys.executable, "-m", "dflashctl", *argv[1:]], check=True, capture_output=True)
    assert " --hash=sha256:" in (tmp_path / "req.txt").read_text()


# ------------------------------------------------------------------ the story's ABI error (issue 15)

NEEDED = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"
DEMANGLED = "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)"
# The shape of sglang-kernel 0.4.2's error (sgl_kernel/load_utils.py): the cause is in the middle.
KERNEL_ERROR = ("ImportError: \n[sgl_kernel] CRITICAL: Could not load any common_ops library!\n\nAttempted locations:\n"
                "1. Architecture-specific pattern: /site/sgl_kernel/sm90/common_ops.* - found files: [...]\n\n"
                "Error details from previous import attempts:\n"
                f"- ImportError: /site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: {NEEDED}\n"
                "- ModuleNotFoundError: No module named 'common_ops'\n")
KERNEL_RESULT = {"probe": "sgl_kernel", "ok": False, "error": KERNEL_ERROR,
                 "facts": {"version": "0.4.2", "compute_capability": "9.0", "expected_variant": "sm90",
                           "torch": "2.9.1+cu128"}}


def test_failure_text_keeps_the_loaders_line_not_the_first_and_last():
    assert probes.failure_text(KERNEL_RESULT) == \
        f"ImportError: /site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: {NEEDED}"
    missing_lib = {"error": "ImportError: \nblah\n- ImportError: libnvrtc.so.13: cannot open shared object file\n- x"}
    assert probes.failure_text(missing_lib) == "ImportError: libnvrtc.so.13: cannot open shared object file"


def test_the_kernel_check_names_the_demangled_symbol_what_it_means_and_the_fix():
    stack = probes.Stack({"sglang-kernel": "0.4.2", "torch": "2.11.0"}, "INSTALL")
    c = probes.check_sgl_kernel(KERNEL_RESULT, stack)
    assert (c.status, c.exit_code) == ("fail", errors.PREFLIGHT_KERNEL)
    assert c.summary == ("sglang-kernel 0.4.2 sm90/common_ops.abi3.so does not load on compute capability 9.0: "
                         f"undefined symbol {DEMANGLED} ({NEEDED}): this sgl_kernel was built against another "
                         "torch than torch 2.9.1+cu128 (torch's C++ API differs between builds)")
    assert c.fix == "sgl_kernel and torch must come from one build (sglang-kernel 0.4.2 is built for torch 2.11.0, " \
                    "CUDA 13): INSTALL"
    assert "nix profile install .#dflash-env" in probes.NO_LOCK.install and "dflashctl export" in probes.NO_LOCK.install


def test_demangling_falls_back_to_libstdcxx_then_to_the_mangled_name(monkeypatch):
    from dflashctl.host import symbols
    monkeypatch.setattr(symbols.shutil, "which", lambda name: None)  # a host without binutils
    assert symbols.demangle(NEEDED) == DEMANGLED  # libstdc++'s __cxa_demangle, through ctypes
    monkeypatch.setattr(symbols, "_cxa_demangle", lambda s: None)
    info = symbols.undefined_symbol(KERNEL_ERROR)
    assert info == {"symbol": NEEDED, "library": "/site/sgl_kernel/sm90/common_ops.abi3.so", "demangled": None}
    assert symbols.describe(info) == NEEDED


def test_fixes_name_the_version_the_lock_pins():
    from pathlib import Path

    from dflashctl.host import fingerprint
    lock = Path(__file__).parent.parent.parent / "nix" / "python-lock.json"
    stack = fingerprint.stack_of_lock(lock, "/py")
    missing = {"ok": True, "facts": {"version": "0.1.10", "missing_names": ["xgrammar.StructuralTag"]}}
    assert probes.check_grammar("xgrammar", missing, stack=stack).fix == "install the locked wheel: xgrammar 0.1.32"
    assert probes.check_grammar("xgrammar", missing).fix == \
        "install the locked wheel: the xgrammar version the lock pins"  # no lock: no number to go stale
    assert fingerprint.stack_of_lock("/nonexistent/lock.json", "/py") is probes.NO_LOCK


def test_doctor_save_to_an_unwritable_place_is_one_line(tmp_path):
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "dflashctl", "doctor", "--save", "/proc/nope.json",
                           "--timeout", "60"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == errors.OUTPUT
    assert "Traceback" not in proc.stderr
    assert "--save /proc/nope.json cannot be written: No such file or directory" in proc.stderr
    assert "probing" not in proc.stderr and proc.stdout == ""  # refused before the probes ran



def test_hung_probes_cost_one_timeout_whatever_the_cores(monkeypatch):
    """16 probes that hang, on a host that claims 2 cores: every probe starts before the first one
    is killed, so the set costs one timeout (bounded by cores, it cost eight, one per batch)."""
    import threading

    events, lock, real = [], threading.Lock(), probes.run_probe

    def counted(*args, **kwargs):
        with lock:
            events.append("start")
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                events.append("end")

    monkeypatch.setattr(probes.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(probes, "available_memory", lambda: 64 * 2**30)
    monkeypatch.setattr(probes, "run_probe", counted)
    results = probes.run_probes(sys.executable, {f"h{i}": ("hang", "") for i in range(16)}, timeout=1.0)
    assert all(r["timed_out"] for r in results.values())
    assert events.index("end") == 16, events  # all 16 started before any ended


def test_probe_slots_are_bounded_by_memory_not_cores():
    gib = 2**30
    assert probes.probe_slots(16, 64 * gib) == 16
    assert probes.probe_slots(16, 3 * gib) == 4  # a small host: 768 MiB a probe
    assert probes.probe_slots(16, 0) == 1  # never none
    assert probes.probe_slots(16, None) == 16  # unknown memory: all at once


def _package(root, name="pkg", modules=4):
    d = root / name
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("")
    for i in range(modules - 1):
        (d / f"m{i}.py").write_text(f"X = {i}\n")
    return d


def _bytecode(root, env_extra=None, names="pkg"):
    import os
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONPATH=str(root), **(env_extra or {}))
    return probes.run_probe(sys.executable, "bytecode", names, 30, env)


def test_a_package_without_byte_code_is_named_with_the_compileall_fix(tmp_path):
    pkg = _package(tmp_path)
    r = _bytecode(tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"})
    assert r["ok"] and r["facts"]["packages"]["pkg"] == {"path": str(pkg), "modules": 4, "current": 0,
                                                         "writable": True}
    c = probes.check_bytecode(r, "/stack/bin/python3")
    assert c.status == "warn" and "pkg 0/4" in c.summary and "every start compiles them" in c.summary
    assert "PYTHONDONTWRITEBYTECODE" in c.summary
    assert c.fix.startswith(f"/stack/bin/python3 -m compileall -q -j0 {pkg}")
    r = _bytecode(tmp_path, {"PYTHONDONTWRITEBYTECODE": ""})
    assert "the first start compiles them" in probes.check_bytecode(r).summary  # and writes them


@pytest.mark.parametrize("mode", ["timestamp", "checked-hash", "unchecked-hash"])
def test_compiled_byte_code_is_current_in_each_invalidation_mode(tmp_path, mode):
    import subprocess
    _package(tmp_path)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", mode, str(tmp_path)],
                   check=True)
    r = _bytecode(tmp_path)
    assert r["facts"]["packages"]["pkg"]["current"] == 4
    c = probes.check_bytecode(r)
    assert c.status == "ok" and c.summary == "pkg: 100 % of 4 modules have current byte code"


@pytest.mark.parametrize("mode,still_current", [("timestamp", False), ("checked-hash", False),
                                                ("unchecked-hash", True)])
def test_an_edited_module_no_longer_counts_unless_its_byte_code_is_unchecked(tmp_path, mode, still_current):
    import os
    import subprocess
    pkg = _package(tmp_path)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", mode, str(tmp_path)],
                   check=True)
    (pkg / "m0.py").write_text("X = 'edited, longer'\n")
    os.utime(pkg / "m0.py", (1, 1))  # a store-like mtime: only the hash or the size can tell
    assert _bytecode(tmp_path)["facts"]["packages"]["pkg"]["current"] == (4 if still_current else 3)


def test_a_read_only_package_without_byte_code_asks_for_an_install_with_it(tmp_path):
    """As a Nix store path would be (root writes anywhere, so the facts are the real probe's, the
    directory then marked read-only)."""
    _package(tmp_path)
    r = _bytecode(tmp_path, {"PYTHONDONTWRITEBYTECODE": ""})
    r["facts"]["packages"]["pkg"]["writable"] = False
    c = probes.check_bytecode(r)
    assert c.status == "warn" and "their directories are read-only" in c.summary
    assert "compileall" not in c.fix and "pip without --no-compile" in c.fix


def test_missing_packages_are_left_out_and_a_failed_probe_is_a_warning(tmp_path):
    _package(tmp_path)
    r = _bytecode(tmp_path, names="pkg,no_such_package_here")
    assert list(r["facts"]["packages"]) == ["pkg"]
    c = probes.check_bytecode({"ok": False, "facts": {}, "error": "timed out after 30 s (killed)"})
    assert c.status == "warn" and "cannot tell" in c.summary


def test_a_background_probe_child_is_deprioritised(monkeypatch):
    seen = []
    monkeypatch.setattr(probes, "deprioritise", seen.append)
    r = probes.run_probe(sys.executable, "python", background=True)
    assert r["ok"] and len(seen) == 1 and isinstance(seen[0], int)
    probes.run_probe(sys.executable, "python")
    assert len(seen) == 1


def test_deprioritise_nices_the_child_and_its_session(tmp_path):
    import os
    import subprocess
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        if os.getpriority(os.PRIO_PROCESS, child.pid) > probes.BACKGROUND_NICENESS:
            pytest.skip("the tests already run at a lower priority than a background probe's")
        probes.deprioritise(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 10
        group = f"/proc/{child.pid}/autogroup"
        if os.path.exists(group):
            assert open(group).read().split()[-1] == "10"
    finally:
        child.kill()
        child.wait()


# --- the checks on their own: the H200's recorded facts (tests/data/service/h200-probes.json), one
# thing changed at a time; each Check whole, as the user and `--json` read it ------------------------

import copy  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from dflashctl.host import symbols  # noqa: E402

H200 = json.loads((Path(__file__).parent.parent / "data" / "service" / "h200-probes.json").read_text())
PINS = probes.Stack({"torch": "2.11.0", "sglang-kernel": "0.4.2", "xgrammar": "0.1.32", "sglang": "0.5.11",
                     "soundfile": "0.13.1", "triton": "3.6.0", "transformers": "5.6.0"}, install="INSTALL")
KEPT = ("error", "where", "returncode", "stderr_tail", "timed_out")  # what a failed probe adds to the facts


def h200(name: str, **facts) -> dict:
    r = copy.deepcopy(H200[name])
    r["facts"].update(facts)
    return r


def failed(error: str, **facts) -> dict:
    return {"ok": False, "error": error, "returncode": 1, "facts": facts}


def expect(check, name, status, summary, fix="", code=0, r=None, **extra):
    """The whole Check: its details are the probe's facts and how it failed (and `extra`)."""
    details = {**(r or {}).get("facts", {}), **{k: r[k] for k in KEPT if k in (r or {})}, **extra}
    assert check.to_json() == {"name": name, "status": status, "summary": summary, "fix": fix, "exit_code": code,
                               "details": details}


def test_the_h200_passes_every_preflight_check():
    checks = probes.preflight_checks(H200, "xgrammar", "DFLASH", PINS)
    want = [("driver", "driver 580.159.04 (CUDA 13.0), 1 GPU: NVIDIA H200 (9.0, 143771 MiB)"),
            ("libcuda", "libcuda.so.1 -> /usr/local/nvidia/lib64/libcuda.so.580.159.04 (CUDA driver API 13.0)"),
            ("libnuma", "libnuma.so.1 -> /usr/lib/x86_64-linux-gnu/libnuma.so.1.0.0"),
            ("torch", "torch 2.11.0+cu130 (CUDA 13.0, C++11 ABI True), GPU: NVIDIA H200 (9.0)"),
            ("sgl_kernel", "sglang-kernel 0.4.2: sm90/common_ops loads (torch 2.11.0+cu130)"),
            ("grammar:xgrammar", "xgrammar 0.1.32: every name SGLang imports is present"),
            ("soundfile", "soundfile 0.13.1, libsndfile 1.2.2"),
            ("sglang", "sglang 0.5.11: server_args found, --speculative-algorithm DFLASH known")]
    keys = ["driver", "libcuda", "libnuma", "torch", "sgl_kernel", "grammar:xgrammar", "soundfile", "sglang"]
    assert len(checks) == len(want)
    for c, (name, summary), key in zip(checks, want, keys):
        expect(c, name, "ok", summary, r=H200[key])


def test_every_preflight_check_of_a_bare_host_names_the_locked_version():
    results = {k: failed("ModuleNotFoundError: No module named 'x'") for k in H200}
    checks = probes.preflight_checks(results, "xgrammar", "DFLASH", PINS)
    fixes = {c.name: c.fix for c in checks}
    assert fixes["torch"] == "install the locked wheel: torch 2.11.0, the CUDA 13.x build"
    assert fixes["sgl_kernel"] == "install the locked wheel: sglang-kernel 0.4.2, built for torch 2.11.0 + CUDA 13"
    assert fixes["grammar:xgrammar"] == "install the locked wheel: xgrammar 0.1.32"
    assert fixes["soundfile"].startswith("install the locked wheel: soundfile 0.13.1 and cffi")
    assert fixes["sglang"] == "install the locked wheel: sglang 0.5.11"
    assert all(c.status == "fail" for c in checks if c.name != "grammar:none")


@pytest.mark.parametrize("version, cuda, ok", [
    ("580.0", "13.0", True), ("580.159.04", "13.0", True), ("590.1", "13.1", True),
    ("579.99", "13.0", False), ("575.57.08", "12.9", False), ("550.54.14", "12.4", False),
    ("580.65", "12.9", False)])
def test_the_driver_floor_is_580_with_cuda_13(version, cuda, ok):
    r = h200("driver", version=version, cuda=cuda)
    summary = f"driver {version} (CUDA {cuda}), 1 GPU: NVIDIA H200 (9.0, 143771 MiB)"
    if ok:
        expect(probes.check_driver(r), "driver", "ok", summary, r=r)
    else:
        expect(probes.check_driver(r), "driver", "fail", f"driver too old for CUDA 13: {summary}",
               "driver too old for CUDA 13: need >= 580", errors.PREFLIGHT_DRIVER, r)


def test_a_driver_without_gpus_or_without_nvml_fails():
    r = h200("driver", gpus=[])
    expect(probes.check_driver(r), "driver", "fail", "driver 580.159.04 (CUDA 13.0), 0 GPU: none",
           "check that the GPUs are visible (nvidia-smi)", errors.PREFLIGHT_DRIVER, r)
    two = h200("driver", gpus=H200["driver"]["facts"]["gpus"] * 2)
    assert probes.check_driver(two).summary == ("driver 580.159.04 (CUDA 13.0), 2 GPU: NVIDIA H200 (9.0, 143771 MiB), "
                                                "NVIDIA H200 (9.0, 143771 MiB)")
    r = failed("OSError: libnvidia-ml.so.1: cannot open shared object file")
    expect(probes.check_driver(r), "driver", "fail", "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)",
           "install NVIDIA driver >= 580 (CUDA 13)", errors.PREFLIGHT_DRIVER, r)
    r = failed("NVMLError: Driver/library version mismatch")
    expect(probes.check_driver(r), "driver", "fail", "NVML failed: NVMLError: Driver/library version mismatch",
           "install NVIDIA driver >= 580 (CUDA 13)", errors.PREFLIGHT_DRIVER, r)
    assert probes.check_driver(failed("libnvidia-ml.so.1 is broken")).summary == \
        "NVML failed: libnvidia-ml.so.1 is broken"


def test_a_gpu_that_does_not_answer_is_named_and_left_to_gpu_health():
    """The driver answers, a GPU does not (lost, fallen off the bus): driver names it, and warns when
    no GPU answers at all (the GPU's fault, which gpu-health fails with its fix), not "no GPUs"."""
    lost = [{"index": 0, "error": "GPU_IS_LOST"}]
    r = h200("driver", gpus=[], unanswered=lost)
    expect(probes.check_driver(r), "driver", "warn",
           "driver 580.159.04 (CUDA 13.0), 0 GPU: none; GPU 0 does not answer (GPU_IS_LOST; see gpu-health)",
           "see the gpu-health check", 0, r)
    two = [{"index": 1}, {"index": 3, "error": "UNKNOWN"}]
    r = h200("driver", unanswered=two)  # GPU 0 answers, 1 and 3 do not
    expect(probes.check_driver(r), "driver", "ok",
           "driver 580.159.04 (CUDA 13.0), 1 GPU: NVIDIA H200 (9.0, 143771 MiB); GPU 1 does not answer "
           "(no answer; see gpu-health); GPU 3 does not answer (UNKNOWN; see gpu-health)", r=r)
    r = h200("driver", version="575.57.08", cuda="12.9", gpus=[], unanswered=lost)  # too old comes first
    expect(probes.check_driver(r), "driver", "fail",
           "driver too old for CUDA 13: driver 575.57.08 (CUDA 12.9), 0 GPU: none; GPU 0 does not answer "
           "(GPU_IS_LOST; see gpu-health)", "driver too old for CUDA 13: need >= 580", errors.PREFLIGHT_DRIVER, r)
    r = h200("driver", gpus=[], unanswered=[])  # nothing silent: no GPUs at all is the driver's failure
    assert (probes.check_driver(r).status, probes.check_driver(r).fix) == (
        "fail", "check that the GPUs are visible (nvidia-smi)")


def test_torch_must_be_a_cuda_13_build_that_sees_a_gpu():
    r = h200("torch", cuda="12.8", version="2.11.0+cu128")
    expect(probes.check_torch(r, PINS), "torch", "fail",
           "torch 2.11.0+cu128 (CUDA 12.8, C++11 ABI True): not a CUDA 13.x build",
           "install the locked wheel: torch 2.11.0, the CUDA 13.x build", errors.PREFLIGHT_TORCH, r)
    r = h200("torch", cuda=None, version="2.11.0+cpu")
    expect(probes.check_torch(r), "torch", "fail",
           "torch 2.11.0+cpu (CUDA none: CPU-only build, C++11 ABI True): not a CUDA 13.x build",
           "install the locked wheel: the torch version the lock pins, the CUDA 13.x build", errors.PREFLIGHT_TORCH, r)
    r = h200("torch", gpu_visible=False)
    expect(probes.check_torch(r), "torch", "fail", "torch 2.11.0+cu130 (CUDA 13.0, C++11 ABI True): no GPU visible "
           "to torch", "check the driver and CUDA_VISIBLE_DEVICES; run nvidia-smi", errors.PREFLIGHT_TORCH, r)
    r = failed("ImportError: libcudart.so.13: cannot open shared object file", version="2.11.0")
    expect(probes.check_torch(r, PINS), "torch", "fail",
           "torch does not import: ImportError: libcudart.so.13: cannot open shared object file",
           "install the locked wheel: torch 2.11.0, the CUDA 13.x build", errors.PREFLIGHT_TORCH, r)
    two = h200("torch", gpus=H200["torch"]["facts"]["gpus"] * 2)
    assert probes.check_torch(two).summary.endswith("GPU: NVIDIA H200 (9.0), NVIDIA H200 (9.0)")


def test_sgl_kernel_for_another_arch_or_not_loading():
    fix = "install the locked wheel: sglang-kernel 0.4.2, built for torch 2.11.0 + CUDA 13"
    r = h200("sgl_kernel", variant="sm100")
    expect(probes.check_sgl_kernel(r, PINS), "sgl_kernel", "warn",
           "sglang-kernel 0.4.2: sm100/common_ops loads (torch 2.11.0+cu130), but sm90/ was expected for compute "
           "capability 9.0", fix, 0, r)
    r = failed("ModuleNotFoundError: No module named 'sgl_kernel'")
    expect(probes.check_sgl_kernel(r, PINS), "sgl_kernel", "fail", "sgl_kernel (sglang-kernel) is not installed", fix,
           errors.PREFLIGHT_KERNEL, r)
    r = failed("OSError: libcudart.so.12: cannot open shared object file", version="0.4.2", compute_capability="9.0")
    expect(probes.check_sgl_kernel(r, PINS), "sgl_kernel", "fail",
           "sglang-kernel 0.4.2 common_ops does not load on compute capability 9.0: "
           "OSError: libcudart.so.12: cannot open shared object file", fix, errors.PREFLIGHT_KERNEL, r)
    assert probes.check_sgl_kernel(failed("OSError: boom", version="0.4.2")).summary == \
        "sglang-kernel 0.4.2 common_ops does not load: OSError: boom"


def test_sgl_kernel_built_against_another_torch_is_named_so():
    symbol = "_ZN3c1017RegisterOperatorsD1Ev"
    r = failed(f"ImportError: /site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: {symbol}", version="0.4.2",
               compute_capability="9.0", torch="2.9.1+cu128")
    c = probes.check_sgl_kernel(r, PINS)
    demangled = c.details["undefined_symbol_demangled"]
    assert demangled == "c10::RegisterOperators::~RegisterOperators()"
    expect(c, "sgl_kernel", "fail",
           f"sglang-kernel 0.4.2 sm90/common_ops.abi3.so does not load on compute capability 9.0: undefined symbol "
           f"{symbols.describe({'symbol': symbol, 'demangled': demangled, 'library': None})}: this sgl_kernel was "
           "built against another torch than torch 2.9.1+cu128 (torch's C++ API differs between builds)",
           "sgl_kernel and torch must come from one build (sglang-kernel 0.4.2 is built for torch 2.11.0, CUDA 13): "
           "INSTALL", errors.PREFLIGHT_KERNEL, r, undefined_symbol=symbol, undefined_symbol_demangled=demangled)
    bare = probes.check_sgl_kernel(failed(f"ImportError: undefined symbol: {symbol}", version="0.4.2"))
    assert bare.summary.startswith("sglang-kernel 0.4.2 common_ops does not load: undefined symbol ")
    assert "than the installed torch (" in bare.summary


def test_grammar_backends_missing_names_and_none():
    r = h200("grammar:xgrammar", version="0.1.10", missing_names=["xgrammar.StructuralTag", "xgrammar.testing.Grammar"])
    expect(probes.check_grammar("xgrammar", r, stack=PINS), "grammar:xgrammar", "fail",
           "xgrammar 0.1.10 lacks StructuralTag, Grammar (SGLang imports them)", "install the locked wheel: xgrammar 0.1.32",
           errors.PREFLIGHT_GRAMMAR, r)
    r = failed("ModuleNotFoundError: No module named 'outlines'")
    expect(probes.check_grammar("outlines", r, required=False), "grammar:outlines", "warn",
           "outlines is not installed (needed only for --grammar-backend outlines)",
           "install the locked wheel: the outlines version the lock pins", 0, r)
    r = failed("ImportError: bad", version="0.7.30")
    expect(probes.check_grammar("llguidance", r), "grammar:llguidance", "fail",
           "llguidance 0.7.30 does not import: ImportError: bad",
           "install the locked wheel: the llguidance version the lock pins", errors.PREFLIGHT_GRAMMAR, r)
    assert probes.check_grammar("llguidance", failed("ImportError: bad")).summary == \
        "llguidance does not import: ImportError: bad"
    r = h200("grammar:xgrammar", missing_names=["xgrammar.X"])
    expect(probes.check_grammar("xgrammar", r, required=False), "grammar:xgrammar", "warn",
           "xgrammar 0.1.32 lacks X (SGLang imports them)", "install the locked wheel: the xgrammar version the lock pins",
           0, r)
    expect(probes.check_grammar("none", None), "grammar:none", "warn",
           "grammar backend 'none': JSON-schema, regex and tool-call constraints are refused",
           "install the locked xgrammar and use --grammar-backend xgrammar")


def test_soundfile_native_libraries_and_sglang():
    fix = "install the locked wheel: soundfile 0.13.1 and cffi (SGLang's OpenAI routes import soundfile at start)"
    r = failed("ModuleNotFoundError: No module named 'soundfile'")
    expect(probes.check_soundfile(r, PINS), "soundfile", "fail", "soundfile is not installed", fix,
           errors.PREFLIGHT_SOUNDFILE, r)
    r = failed("ModuleNotFoundError: No module named '_cffi_backend'")
    assert probes.check_soundfile(r).summary == "soundfile does not import: ModuleNotFoundError: No module named " \
                                               "'_cffi_backend'"
    r = failed("OSError: libnuma.so.1: cannot open shared object file")
    expect(probes.check_native("libnuma.so.1", r), "libnuma", "fail",
           "libnuma.so.1 does not load: OSError: libnuma.so.1: cannot open shared object file",
           "install libnuma (Debian/Ubuntu: apt install libnuma1; Nix: numactl)", errors.PREFLIGHT_NATIVE, r)
    assert probes.check_native("libcuda.so.1", failed("OSError: no")).fix == \
        "install the NVIDIA driver >= 580; libcuda.so.1 comes with it"
    r = h200("sglang")
    expect(probes.check_sglang(r, "ddtree", PINS), "sglang", "fail",
           "sglang 0.5.11 does not know --speculative-algorithm ddtree (it takes DFLASH, EAGLE, EAGLE3, NEXTN, "
           "STANDALONE, NGRAM)", "use a patched SGLang that adds it (see the flake's sglang overrides) or another "
           "algorithm", errors.PREFLIGHT_SGLANG, r)
    expect(probes.check_sglang(r, "dflash"), "sglang", "ok",
           "sglang 0.5.11: server_args found, --speculative-algorithm DFLASH known", r=r)
    assert probes.check_sglang(r, None).summary == "sglang 0.5.11: server_args found"
    assert probes.check_sglang(h200("sglang", speculative_algorithms=[]), "DDTREE").status == "ok"  # SGLang decides
    r = failed("ModuleNotFoundError: No module named 'sglang'")
    expect(probes.check_sglang(r, None, PINS), "sglang", "fail", "sglang is not installed",
           "install the locked wheel: sglang 0.5.11", errors.PREFLIGHT_SGLANG, r)
    assert probes.check_sglang(failed("SyntaxError: bad", version="0.5.11"), None).summary == \
        "sglang's server_args cannot be read: SyntaxError: bad"


def test_flashinfer_nvcc_triton_and_transformers_checks():
    r = failed("ModuleNotFoundError: No module named 'triton'")
    expect(probes.check_triton(r, PINS), "triton", "fail", "triton is not installed",
           "install the locked wheel: triton 3.6.0 (the one torch pins)", errors.FAILED, r)
    assert probes.check_triton(failed("ImportError: x", version="3.6.0")).summary == "triton does not import: ImportError: x"
    r = {"ok": True, "facts": {"version": "3.6.0"}}
    expect(probes.check_triton(r), "triton", "ok", "triton 3.6.0", r=r)
    fi = "install the locked wheel: flashinfer-python and flashinfer-cubin"
    r = failed("ModuleNotFoundError: No module named 'flashinfer'")
    expect(probes.check_flashinfer(r), "flashinfer", "warn",
           "flashinfer is not installed (only --attention-backend triton works)", fi, 0, r)
    r = failed("ImportError: y", version="0.6.8.post1")
    expect(probes.check_flashinfer(r), "flashinfer", "fail", "flashinfer 0.6.8.post1 does not import: ImportError: y",
           fi, errors.FAILED, r)
    r = {"ok": True, "facts": {"version": "0.6.8.post1", "cubins": 0}}
    expect(probes.check_flashinfer(r), "flashinfer", "warn", "flashinfer 0.6.8.post1: no flashinfer-cubin cubins, "
           "kernels compile at first use (a silent pause of a minute or more)", fi, 0, r)
    r = {"ok": True, "facts": {"version": "0.6.8.post1", "cubins": 812, "cubin_version": "0.6.8.post1"}}
    expect(probes.check_flashinfer(r), "flashinfer", "ok", "flashinfer 0.6.8.post1, 812 cubins from flashinfer-cubin "
           "0.6.8.post1", r=r)
    r = failed("FileNotFoundError: no nvcc")
    expect(probes.check_nvcc(r), "nvcc", "warn", "the stack has no nvcc (nvidia-cuda-nvcc): SGLang's first start "
           "compiles JIT kernels with the host's CUDA toolkit, if any, or fails after the weights load",
           "install the locked wheel: cuda-toolkit[nvcc,crt,nvvm,cccl] as nix/stack.toml pins it", 0, r)
    r = {"ok": True, "facts": {"nvcc_version": "13.0.88", "cu13": "/s/nvidia/cu13"}}
    expect(probes.check_nvcc(r), "nvcc", "ok", "nvcc 13.0.88 from the stack (/s/nvidia/cu13) for SGLang's JIT kernels",
           r=r)
    assert probes.check_nvcc({"ok": True, "facts": {"cu13": "/c"}}).summary.startswith("nvcc (no wheel metadata) from")
    r = failed("ModuleNotFoundError: No module named 'transformers'")
    expect(probes.check_transformers(r, PINS), "transformers", "fail", "transformers is not installed",
           "install the locked wheel: transformers 5.6.0", errors.FAILED, r)
    assert probes.check_transformers(failed("ImportError: z", version="5.6.0")).summary == \
        "transformers does not import: ImportError: z"
    r = {"ok": True, "facts": {"version": "5.6.0", "tokenizers": "0.22.2"}}
    expect(probes.check_transformers(r), "transformers", "ok", "transformers 5.6.0 (tokenizers 0.22.2)", r=r)


def pkg(modules, current, writable=True, path="/s/torch"):
    return {"modules": modules, "current": current, "writable": writable, "path": path}


def test_bytecode_below_nine_in_ten_is_a_warning_with_the_fix():
    r = {"ok": True, "facts": {"packages": {"torch": pkg(10, 9), "sglang": pkg(0, 0)}}}
    expect(probes.check_bytecode(r), "bytecode", "ok", "torch, sglang: 90 % of 10 modules have current byte code", r=r)
    none = probes.check_bytecode({"ok": True, "facts": {"packages": {}}})
    assert none.summary == "no package found: none of 0 modules have current byte code"
    r = {"ok": True, "facts": {"packages": {"torch": pkg(10, 8), "sympy": pkg(4, 4), "triton": pkg(5, 1, path="/s/t")}}}
    expect(probes.check_bytecode(r, "py"), "bytecode", "warn",
           "modules without current byte code: torch 8/10, triton 1/5: the first start compiles them, about doubling its "
           "imports (and writes byte code for the next)",
           "py -m compileall -q -j0 /s/torch /s/t (what pip and Nix do at install)", 0, r)
    assert probes.check_bytecode(r).fix.startswith("python3 -m compileall")
    env = probes.check_bytecode({"ok": True, "facts": {"dont_write_bytecode": True, "packages": {"torch": pkg(10, 0)}}})
    assert env.summary.endswith("every start compiles them (PYTHONDONTWRITEBYTECODE is set), which about doubles "
                                "SGLang's import time")
    ro = probes.check_bytecode({"ok": True, "facts": {"packages": {"torch": pkg(10, 0, False), "sglang": pkg(10, 0)}}})
    assert ro.summary.endswith("every start compiles them (their directories are read-only), which about doubles "
                               "SGLang's import time")
    assert ro.fix == ("install the stack with its byte code: pip without --no-compile, or the flake's dflash-env "
                      "(its packages carry byte code)")
    r = failed("RuntimeError: no")
    expect(probes.check_bytecode(r), "bytecode", "warn", "cannot tell whether the stack has byte code: RuntimeError: no",
           "run doctor again; if it persists, report it with `dflashctl doctor --json`", 0, r)


def test_failure_text_finds_the_loaders_line_in_a_long_error():
    assert probes.failure_text({}) == "unknown failure"
    assert probes.failure_text({"error": "  - one line  "}) == "one line"
    assert probes.failure_text({"error": "- Xid 79: GPU fell off the bus"}) == "Xid 79: GPU fell off the bus"
    long = "\n".join(["[sgl_kernel] CRITICAL: Could not load any common_ops library!", "tried:",
                      "- sm90: libcudart.so.12: cannot open shared object file", "- sm100: version `GLIBC_2.38'",
                      "end"])
    assert probes.failure_text({"error": long}) == "sm90: libcudart.so.12: cannot open shared object file"
    assert probes.failure_text({"error": "a\nundefined symbol: x\nversion `y'"}) == "undefined symbol: x"
    assert probes.failure_text({"error": "first\nmiddle\nlast"}) == "first … last"
    assert probes.not_installed(failed("ModuleNotFoundError: No module named 'x'"))
    assert not probes.not_installed(failed("ModuleNotFoundError: inner", version="1.0"))
    assert not probes.not_installed(failed("ImportError: x"))
    assert probes.evidence({"facts": {"a": 1}, "error": "e", "where": "w", "returncode": 1, "stderr_tail": ["t"],
                            "timed_out": True, "seconds": 3, "ok": False}) == {
        "a": 1, "error": "e", "where": "w", "returncode": 1, "stderr_tail": ["t"], "timed_out": True}
    assert probes.evidence({"error": "e"}) == {"error": "e"}  # a result without facts


def test_how_a_child_ended_and_how_many_run_at_once(monkeypatch):
    assert probes.describe_exit(-9) == "crashed: killed by SIGKILL"
    assert probes.describe_exit(-200) == "crashed: killed by signal 200"
    assert probes.describe_exit(3) == "exited with status 3 before reporting"
    assert probes.describe_exit(0) == "exited with status 0 before reporting"
    gib = 2**30
    assert probes.probe_slots(8, None) == 8 and probes.probe_slots(0, None) == 1
    slots = probes.probe_slots(8, int(3.5 * gib))  # 768 MiB each: 4 and a bit
    assert slots == 4 and isinstance(slots, int)
    assert probes.probe_slots(8, 100 * gib) == 8 and probes.probe_slots(8, 10) == 1
    monkeypatch.setattr(probes, "open", lambda path: io.StringIO(MEMINFO) if path == "/proc/meminfo" else None,
                        raising=False)
    assert probes.available_memory() == 123456 * 1024
    monkeypatch.setattr(probes, "open", lambda path: io.StringIO("MemTotal: 1 kB\n"), raising=False)
    assert probes.available_memory() is None
    monkeypatch.setattr(probes, "open", lambda path: io.StringIO("MemAvailable: lots kB\n"), raising=False)
    assert probes.available_memory() is None


MEMINFO = "MemTotal:       263855196 kB\nMemFree:         1234 kB\nMemAvailable:     123456 kB\nBuffers: 1 kB\n"


def test_the_probes_preflight_runs_follow_the_backend():
    assert probes.preflight_probes("none", None) == {
        "driver": ("driver", ""), "libcuda": ("native", "libcuda.so.1"), "libnuma": ("native", "libnuma.so.1"),
        "torch": ("torch", ""), "sgl_kernel": ("sgl_kernel", ""), "soundfile": ("soundfile", ""),
        "sglang": ("sglang", "")}
    wanted = probes.preflight_probes("llguidance", "DFLASH")
    assert wanted["grammar:llguidance"] == ("grammar", "llguidance") and wanted["sglang"] == ("sglang", "DFLASH")
    assert list(wanted)[-1] == "grammar:llguidance"


def test_a_stack_without_a_lock_names_no_version():
    assert probes.NO_LOCK.wheel("torch") == "the torch version the lock pins"
    assert PINS.wheel("torch") == "torch 2.11.0" and probes.Stack({"torch": ""}).wheel("torch").startswith("the ")
    assert probes.NO_LOCK.install.startswith("install the locked stack into this environment: `dflashctl export")


def test_an_unknown_grammar_backend_is_a_config_error_before_any_probe():
    with pytest.raises(errors.DflashError) as e:
        probes.preflight("regexy", None)
    assert (e.value.what, e.value.why, e.value.fix, e.value.exit_code) == (
        "unknown grammar backend 'regexy'", "", "use one of xgrammar, llguidance, outlines, none", errors.CONFIG)


# --- the runner with stand-in interpreters: a script in the place of python ----------------------

def interpreter(tmp_path, script: str) -> str:
    """An executable that stands where the stack's python would, running `script` (bash)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/bash\n" + script)
    path.chmod(0o755)
    return str(path)


def test_what_the_runner_keeps_of_a_child(tmp_path):
    py = interpreter(tmp_path, 'sleep 0.3\necho "{\\"ok\\": true, \\"facts\\": {\\"probe\\": \\"$3\\", \\"arg\\": \\"$4\\", '
                               '\\"env\\": \\"$DFLASH_TEST_MARK\\"}}"\necho "noise on stderr" >&2\n')
    before = time.monotonic()
    r = probes.run_probe(py, "python", env={**os.environ, "DFLASH_TEST_MARK": "seen"})
    took = time.monotonic() - before
    assert (r["probe"], r["arg"], r["ok"], r["returncode"]) == ("python", "", True, 0)
    assert r["facts"] == {"probe": "python", "arg": "", "env": "seen"}
    assert 0.3 <= r["seconds"] <= took + 0.005 and round(r["seconds"], 2) == r["seconds"]  # slept 0.3 s; rounded
    assert "stderr_tail" not in r and "error" not in r  # a passing probe's noise is not kept
    many = probes.run_probes(py, {"a": ("python", "x"), "b": ("torch", "")}, env={**os.environ, "DFLASH_TEST_MARK": "m"})
    assert {k: (v["facts"]["arg"], v["facts"]["env"]) for k, v in many.items()} == {"a": ("x", "m"), "b": ("", "m")}


def test_a_child_that_fails_keeps_the_end_of_its_stderr(tmp_path):
    py = interpreter(tmp_path, 'for i in $(seq 1 20); do echo "line $i" >&2; done\nprintf "\\xff bad\\n" >&2\nexit 3\n')
    r = probes.run_probe(py, "python")
    assert (r["ok"], r["returncode"], r["error"]) == (False, 3, "exited with status 3 before reporting")
    assert r["stderr_tail"] == [f"line {i}" for i in range(10, 21)] + ["\ufffd bad"]  # the last 12 lines
    assert r["facts"] == {}
    garbled = probes.run_probe(interpreter(tmp_path, "echo not json\n"), "python")
    assert (garbled["ok"], garbled["error"]) == (False, "the probe wrote an unreadable result")


def test_background_probes_run_niced_and_others_not(tmp_path):
    # the runner lowers the child's priority just after starting it: read it a moment later
    py = interpreter(tmp_path, 'sleep 0.5\necho "{\\"ok\\": true, \\"facts\\": {\\"nice\\": $(nice)}}"\n')
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine >= 10:
        pytest.skip("the tests already run at a lower priority than a background probe's")
    assert probes.run_probes(py, {"a": ("python", "")})["a"]["facts"]["nice"] == mine
    assert probes.run_probes(py, {"a": ("python", "")}, background=True)["a"]["facts"]["nice"] == 10


def test_a_missing_interpreter_says_why(tmp_path):
    r = probes.run_probe(str(tmp_path / "nope"), "python")
    assert r == {"probe": "python", "arg": "", "ok": False, "facts": {},
                 "error": f"cannot run {tmp_path / 'nope'}: No such file or directory"}


def test_preflight_passes_its_timeout_environment_algorithm_and_lock_to_the_probes(tmp_path):
    """An interpreter whose every probe hangs: the timeout given ends them; a site with a stand-in
    sglang (version metadata, server_args.py): the algorithm reaches the sglang check, the lock the fixes."""
    hang = interpreter(tmp_path, "sleep 5\n")
    checks = probes.preflight("none", None, hang, timeout=0.3)
    assert {c.summary for c in checks if c.name == "driver"} == {"NVML failed: timed out after 0.3 s (killed)"}
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server_args.py").write_text(
        'def add_cli_args(parser):\n    parser.add_argument("--speculative-algorithm", choices=["DFLASH", "EAGLE"])\n')
    (site / "sglang-0.5.11.dist-info").mkdir()
    (site / "sglang-0.5.11.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.11\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    checks = {c.name: c for c in probes.preflight("none", "DFLASH", sys.executable, stack=PINS, env=env)}
    assert checks["sglang"].summary == "sglang 0.5.11: server_args found, --speculative-algorithm DFLASH known"
    assert checks["sglang"].details["algorithm"] == "DFLASH"
    assert checks["torch"].fix == "install the locked wheel: torch 2.11.0, the CUDA 13.x build"
