"""The installed dflashctl knows the lock it belongs to (lock/locate.py, python/setup.py).

Real builds: the package is built from a copy of the repository's python/ (with and without the
repository's nix/python-lock.json beside it, as `pip install ./python` sees it), installed without
-e into a fresh venv, and doctor runs from another directory. Building needs setuptools and wheel
from the package index (pip's build isolation), hence the `network` mark.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import packaging
import pytest

from dflashctl.lock import locate

REPO = Path(__file__).resolve().parent.parent.parent
LOCK = REPO / "nix" / "python-lock.json"


def install(tmp: Path, with_lock: bool) -> Path:
    """A venv with dflashctl built from a copy of python/ (pip's in-tree build, no network)."""
    repo = tmp / "repo"
    shutil.copytree(REPO / "python", repo / "python",
                    ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    if with_lock:
        (repo / "nix").mkdir()
        shutil.copy(LOCK, repo / "nix" / "python-lock.json")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    shutil.copytree(Path(packaging.__file__).parent, site / "packaging")  # its one dependency, offline
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", locate.ENV)}
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(repo / "python")],
                   check=True, capture_output=True, env=env)
    shutil.rmtree(repo)  # nothing of the source is left to fall back on
    return venv


def doctor(venv: Path, cwd: Path, *args: str, env: dict | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", locate.ENV)}
    proc = subprocess.run([str(venv / "bin/dflashctl"), "doctor", "--json", "--timeout", "60", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=180, env={**base, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def venv_with_lock(tmp_path_factory):
    return install(tmp_path_factory.mktemp("with-lock"), with_lock=True)


@pytest.mark.network
def test_an_installed_dflashctl_uses_the_lock_it_was_built_with_from_any_directory(venv_with_lock, tmp_path):
    fp = doctor(venv_with_lock, tmp_path)
    packaged = fp["lock"]["path"]
    assert fp["lock"]["source"] == "installed with dflashctl"
    assert packaged.startswith(str(venv_with_lock)) and packaged.endswith("dflashctl/lock/data/python-lock.json")
    assert json.loads(Path(packaged).read_text()) == json.loads(LOCK.read_text())
    checks = {c["name"]: c for c in fp["checks"]}
    assert "lock" not in checks  # compared: the Python version and the packages were checked
    assert checks["python"]["summary"].endswith("3.12") or checks["python"]["status"] == "ok"
    assert "against " + packaged in checks["packages"]["summary"]


@pytest.mark.network
def test_lock_flag_and_environment_override_the_packaged_lock(venv_with_lock, tmp_path):
    mine = tmp_path / "other-lock.json"
    mine.write_text(LOCK.read_text())
    assert doctor(venv_with_lock, tmp_path, env={locate.ENV: str(mine)})["lock"]["source"] == f"${locate.ENV}"
    fp = doctor(venv_with_lock, tmp_path, "--lock", str(mine), env={locate.ENV: "/nonexistent"})
    assert (fp["lock"]["path"], fp["lock"]["source"]) == (str(mine), "--lock")


@pytest.mark.network
def test_without_a_lock_doctor_says_so_with_the_fix(tmp_path):
    venv = install(tmp_path, with_lock=False)
    fp = doctor(venv, tmp_path)
    checks = {c["name"]: c for c in fp["checks"]}
    lock = checks["lock"]
    assert lock["status"] == "warn"
    assert lock["summary"].startswith("installed packages and the Python version not compared: no lock found")
    assert f"set {locate.ENV}" in lock["fix"] and "pip install ./python" in lock["fix"]
    assert "python" not in checks and "packages" not in checks


def test_a_source_checkout_uses_its_own_lock(tmp_path):
    found = locate.find(env={})
    # this test runs from the repository (editable install or PYTHONPATH=python)
    assert (found.path, found.source) == (LOCK, "this dflashctl's source checkout")
    assert locate.find("x.json", env={locate.ENV: "y.json"}).path == Path("x.json")
