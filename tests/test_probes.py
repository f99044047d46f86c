"""The probe runner with real child processes: crashes, hangs and missing interpreters are findings."""

import sys

from dflashctl import errors, probes


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
    first = probes.first_failure(checks)
    assert first is not None and first.exit_code in errors.NO_RESTART
    assert all(c.exit_code in errors.NO_RESTART for c in checks if c.status == "fail")


def test_preflight_refuses_an_unknown_grammar_backend():
    try:
        probes.preflight("regexy", None)
    except errors.DflashError as e:
        assert e.exit_code == errors.CONFIG
    else:
        raise AssertionError("an unknown backend was accepted")
