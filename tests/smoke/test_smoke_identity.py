"""What a smoke result says about the host it measured, and `diff` over two results.

The stand-in SGLang runs where there is no GPU, no driver and no torch: the identity must say so
field by field (null, with the reason) and still name the host, Python, dflashctl and the lock.
"""

import json
import platform
from importlib import metadata
import socket
import subprocess
import sys

from smoke_runner import PYTHON_DIR, env_for, smoke

from dflashctl import __version__, errors
from dflashctl.lock import lockfile

LOCK = PYTHON_DIR.parent / "nix" / "python-lock.json"


def dflashctl(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "dflashctl", *args], env=env_for(),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_identity_without_a_gpu_is_null_with_reasons(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--lock", str(LOCK), "--json", "result.json")
    assert p.returncode == 0, p.stderr
    ident = json.loads((tmp_path / "result.json").read_text())["identity"]
    assert ident["hostname"] == socket.gethostname()
    assert ident["python"] == platform.python_version() and ident["dflashctl"] == __version__
    for field in ("gpus", "gpu_count", "driver", "driver_cuda", "cuda_driver_api", "torch",
                  "sglang_kernel", "xgrammar"):
        assert ident[field] is None and ident["unknown"][field], field
    # The test extra installs triton (tests/host/test_triton_kernels.py): it is read as installed, or
    # null with the reason where it is not.
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    assert ident["triton"] == triton and (triton or ident["unknown"]["triton"])
    assert "driver probe" in ident["unknown"]["gpus"]  # NVML: no libnvidia-ml here
    assert "torch" in ident["unknown"]["torch"]
    assert ident["unknown"]["sglang"] == "no sglang distribution (dist-info) for this Python"  # the stand-in
    assert ident["lock_spec_sha256"] == lockfile.load(LOCK).spec_sha256
    assert ident["lock_matches"] is False and "missing" in ident["lock_check"]  # no torch & co. here
    assert ident["fingerprint"]["fingerprint_version"] == 1
    first = p.stdout.splitlines()[0]
    assert first.startswith(f"measured on {socket.gethostname()}: GPU ?; driver ? (CUDA driver API ?); "
                            f"Python {platform.python_version()}, torch ?")
    assert f"lock {ident['lock_spec_sha256'][:12]} DIFFERS; dflashctl {__version__}" in first


def test_no_lock_found_is_unknown_not_a_failure(tmp_path):
    p = smoke(tmp_path, "--runs", "DFLASH", "--lock", str(tmp_path / "absent.json"), "--json", "result.json")
    assert p.returncode == 0, p.stderr
    ident = json.loads((tmp_path / "result.json").read_text())["identity"]
    assert ident["lock_matches"] is None and "no lock at" in ident["unknown"]["lock_matches"]
    assert "; lock ?; " in p.stdout.splitlines()[0]


def test_diff_explains_two_smoke_results(tmp_path):
    p = smoke(tmp_path, "--runs", "DFLASH", "--lock", str(LOCK), "--json", "a.json")
    assert p.returncode == 0, p.stderr
    same = dflashctl(tmp_path, "doctor", "--lock", str(LOCK), "--save", "doctor.json")
    assert same.returncode in (0, 1), same.stderr
    d = dflashctl(tmp_path, "diff", "a.json", "doctor.json")
    assert d.returncode == 0 and d.stdout.startswith("no differences"), d.stdout + d.stderr
    b = json.loads((tmp_path / "a.json").read_text())  # the same result from another host
    fp = b["identity"]["fingerprint"]
    fp["packages"]["xgrammar"] = "0.1.10"
    fp["host"]["hostname"] = "gpu-host-2"
    (tmp_path / "b.json").write_text(json.dumps(b))
    d = dflashctl(tmp_path, "diff", "--json", "a.json", "b.json")
    assert d.returncode == 0, d.stderr
    rows = {r["item"]: (r["a"], r["b"]) for r in json.loads(d.stdout)["differences"]}
    assert rows["xgrammar"] == (None, "0.1.10")  # not installed where the tests run
    assert rows["hostname"] == (socket.gethostname(), "gpu-host-2")


def test_url_mode_does_not_pretend_to_know_the_services_host(tmp_path, running):
    url = running("DFLASH")
    p = smoke(tmp_path, "--url", url, "--json", "result.json")
    assert p.returncode == 0, p.stderr
    ident = json.loads((tmp_path / "result.json").read_text())["identity"]
    assert ident["sglang"] == "0.5.11"  # what the service's /server_info says
    assert ident["gpus"] is None and "--url" in ident["unknown"]["gpus"] and ident["fingerprint"] is None
    d = dflashctl(tmp_path, "diff", "result.json", "result.json")
    assert d.returncode == errors.INPUT and "carries no fingerprint" in d.stderr


def test_a_failed_start_still_says_which_host(tmp_path):
    p = smoke(tmp_path, "--runs", "DFLASH", "--lock", str(LOCK), "--json", "result.json", FAKE_SGLANG_DIE="start")
    assert p.returncode == errors.SERVER_DIED_BEFORE_READY, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["identity"]["hostname"] == socket.gethostname()
    assert result["identity"]["lock_spec_sha256"] == lockfile.load(LOCK).spec_sha256
