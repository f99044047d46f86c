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
    data = json.loads((Path(__file__).parent.parent / "nix/python-lock.json").read_text())
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
    lock = Path(__file__).parent.parent / "nix" / "python-lock.json"
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
    assert probes.probe_slots(16, 3 * gib) == 3 * gib // probes.PROBE_MEMORY_BYTES  # 4: a small host
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
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == probes.BACKGROUND_NICENESS
        group = f"/proc/{child.pid}/autogroup"
        if os.path.exists(group):
            assert open(group).read().split()[-1] == str(probes.BACKGROUND_NICENESS)
    finally:
        child.kill()
        child.wait()
