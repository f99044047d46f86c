"""`dflashctl lock` against the live package index (marker `network`; a few seconds each)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lockfixtures import DATA, build

from dflashctl.lock import lockfile
from dflashctl.lock.export import requirements_text
from dflashctl.lock.wheels import platforms

pytestmark = pytest.mark.network
REPO = Path(__file__).resolve().parent.parent.parent


def dflashctl(*args, cwd=REPO, **env):
    full_env = dict(os.environ, PYTHONPATH=str(REPO / "python"), **env)
    return subprocess.run([sys.executable, "-m", "dflashctl", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small real spec of tests/data/lock, locked live once for this module."""
    d = tmp_path_factory.mktemp("small")
    shutil.copy(DATA / "stack.toml", d / "stack.toml")
    r = dflashctl("lock", "--spec", "stack.toml", "--lock", "lock.json", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    return d, json.loads(r.stdout)


def test_live_lock_matches_the_captured_fixture(small):
    d, summary = small
    text = (d / "lock.json").read_text()
    # exclude-newer freezes the answer: today's resolution is the one captured in the fixture.
    assert text == build().dumps()
    lock = lockfile.load(d / "lock.json")
    for system, info in summary["systems"].items():
        assert info["packages"] == len(lock.packages(system))
        assert info["packages"] + info["dev_packages"] == len(lock.systems[system])
        assert info["download_bytes"] == sum(w.size for w in lock.systems[system].values())


def test_relock_is_byte_identical(small):
    d, _ = small
    before = (d / "lock.json").read_bytes()
    r = dflashctl("lock", "--spec", "stack.toml", "--lock", "lock.json", "--json", "-q", cwd=d)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["changed"] is False
    assert (d / "lock.json").read_bytes() == before


@pytest.mark.parametrize("system,package", [("x86_64-linux", "soundfile"), ("aarch64-linux", "pycparser")])
def test_downloaded_wheel_has_the_locked_sha256(small, tmp_path, system, package):
    d, _ = small
    lock = lockfile.load(d / "lock.json")
    wheel = lock.systems[system][package]
    line = next(ln for ln in requirements_text(lock, system).splitlines() if ln.startswith(f"{package}=="))
    (tmp_path / "req.txt").write_text(line + "\n")
    # pip expands only the legacy manylinux aliases given with --platform, so name every tag a
    # glibc-2.34 host accepts (on a real host pip derives them from its own glibc).
    plats = [arg for p in platforms(system, (2, 34)) for arg in ("--platform", p)]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                        "--only-binary=:all:", *plats,
                        "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                        "-r", str(tmp_path / "req.txt"), "-d", str(tmp_path / "dl")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (got,) = (tmp_path / "dl").iterdir()
    assert got.name == wheel.file
    assert hashlib.sha256(got.read_bytes()).hexdigest() == wheel.sha256
    assert got.stat().st_size == wheel.size


def test_check_passes_on_a_fresh_lock_and_catches_tampering(small, tmp_path):
    d, _ = small
    ok = dflashctl("lock", "--check", "--spec", "stack.toml", "--lock", "lock.json", "-q", cwd=d)
    assert ok.returncode == 0, ok.stderr

    data = json.loads((d / "lock.json").read_text())
    data["systems"]["aarch64-linux"]["packages"]["torch"]["sha256"] = "f" * 64
    (tmp_path / "forged.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    r = dflashctl("lock", "--check", "--spec", str(d / "stack.toml"), "--lock", str(tmp_path / "forged.json"), "-q")
    assert r.returncode == 1
    assert "was tampered with" in r.stderr and "torch (aarch64-linux)" in r.stderr
    assert re.search(r"aarch64-linux\s+torch\s+re-hashed", r.stdout)


def test_check_reports_a_stale_lock_with_a_diff(small, tmp_path):
    d, _ = small
    data = json.loads((d / "lock.json").read_text())
    data["systems"]["x86_64-linux"]["packages"]["numpy"]["version"] = "1.26.4"
    (tmp_path / "old.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    r = dflashctl("lock", "--check", "--spec", str(d / "stack.toml"), "--lock", str(tmp_path / "old.json"), "-q")
    assert r.returncode == 1
    assert "is stale" in r.stderr
    assert re.search(r"x86_64-linux\s+numpy\s+upgraded\s+1\.26\.4", r.stdout)


def test_check_refuses_a_hand_formatted_lock(small, tmp_path):
    d, _ = small
    (tmp_path / "compact.json").write_text(json.dumps(json.loads((d / "lock.json").read_text())))
    r = dflashctl("lock", "--check", "--spec", str(d / "stack.toml"), "--lock", str(tmp_path / "compact.json"), "-q")
    assert r.returncode == 1 and "not in canonical form" in r.stderr


def _spec(tmp_path, requirements) -> Path:
    text = (DATA / "stack.toml").read_text().split("requirements = [")[0]
    text += "requirements = " + json.dumps(requirements) + "\n"
    (tmp_path / "stack.toml").write_text(text)
    (tmp_path / "lock.json").write_text("previous lock\n")
    return tmp_path / "stack.toml"


def test_unsatisfiable_pin_keeps_the_old_lock(tmp_path):
    _spec(tmp_path, ["torch==2.11.0", "triton==3.5.0"])
    r = dflashctl("lock", "--spec", "stack.toml", "--lock", "lock.json", "-q", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "cannot be satisfied" in r.stderr and "triton" in r.stderr
    assert (tmp_path / "lock.json").read_text() == "previous lock\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock.json", "stack.toml"]


def test_package_without_a_wheel_for_one_system(tmp_path):
    _spec(tmp_path, ["decord==0.6.0"])  # x86_64 wheels only
    r = dflashctl("lock", "--spec", "stack.toml", "--lock", "lock.json", "-q", cwd=tmp_path)
    assert r.returncode == 1
    assert "no wheel for one of the systems" in r.stderr and "aarch64" in r.stderr
    assert (tmp_path / "lock.json").read_text() == "previous lock\n"


def test_network_failure_is_one_paragraph_and_writes_nothing(tmp_path):
    _spec(tmp_path, ["packaging==26.2"])
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    r = dflashctl("lock", "--spec", "stack.toml", "--lock", "lock.json", "-q", cwd=tmp_path,
                  HTTPS_PROXY=dead, HTTP_PROXY=dead, ALL_PROXY=dead, UV_NO_CACHE="1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "could not be reached" in r.stderr
    assert (tmp_path / "lock.json").read_text() == "previous lock\n"


def test_committed_lock_is_up_to_date():
    r = dflashctl("lock", "--check", "--json", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == {"up_to_date": True, "changes": []}


def test_committed_router_lock_is_up_to_date_and_has_no_torch():
    """The router's own environment (nix/router.toml): re-resolved, the same lock; no torch, and
    only one of the two router packages (sglang-router 0.3.2 installs an `smg` script itself)."""
    r = dflashctl("lock", "--check", "--json", "-q", "--spec", "nix/router.toml", "--lock", "nix/router-lock.json",
                  cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == {"up_to_date": True, "changes": []}
    lock = json.loads((REPO / "nix" / "router-lock.json").read_text())
    for system in ("x86_64-linux", "aarch64-linux"):
        names = set(lock["systems"][system]["packages"])
        assert "sglang-router" in names and not names & {"torch", "smg", "triton"}, names


@pytest.mark.parametrize("system", ["x86_64-linux", "aarch64-linux"])
def test_audit_of_a_sample_of_the_committed_lock(system, tmp_path):
    """`dflashctl audit` on the real lock, for a small sample (the full audit downloads ~3.6 GiB
    per system: a benchmark, docs/benchmarks.md): soundfile's bundled libsndfile and
    torch-memory-saver's hooks (libcudart from nvidia-cuda-runtime via its fix-up) resolve."""
    r = dflashctl("audit", "--system", system, "--only", "soundfile,torch-memory-saver",
                  "--cache", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["systems"][system]["elf_files"] >= 3
    assert report["downloaded"] >= 4  # the two wheels and their dependency closures
    again = dflashctl("audit", "--system", system, "--only", "soundfile,torch-memory-saver",
                      "--cache", str(tmp_path), "--json")
    assert json.loads(again.stdout)["reused"] == report["downloaded"]
