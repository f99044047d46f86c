"""doctor and diff against real virtual environments built from chosen wheels.

One base venv holds what importing xgrammar needs (CPU torch from this machine's disk, transformers,
triton, ...); each variant is a fresh venv with its own xgrammar / soundfile wheels and a .pth line
that appends the base's site-packages. Building all of it takes about a minute on two cores.
Goldens: tests/regenerate rewrites tests/data/doctor/*.golden. DFLASH_DOCTOR_VENVS=DIR keeps
the venvs in DIR and reuses them on the next run (for working on these tests).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import update_golden
from doctor_cli import diff, doctor

from dflashctl import errors

DATA = Path(__file__).parent.parent / "data" / "doctor"
BASE = ["torch==2.13.0", "transformers", "pydantic", "numpy", "sentencepiece", "tiktoken", "triton==3.6.0"]
VARIANTS = {
    "good": ["xgrammar==0.1.32", "soundfile==0.13.1", "cffi==2.1.1", "pycparser==3.12"],
    "old": ["xgrammar==0.1.10"],  # the second host of the story: old xgrammar, no soundfile
    "nocffi": ["xgrammar==0.1.32", "soundfile==0.13.1"],  # soundfile without its cffi backend
}
pytestmark = [pytest.mark.network, pytest.mark.slow]


def pip(python: Path, *args: str) -> None:
    # --no-compile: byte-compiling all of torch and transformers at install took ~60% of the
    # install's CPU time; the doctor runs compile only what their probes import (see doctor()).
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check",
                    *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.fixture(scope="session")
def venvs(tmp_path_factory) -> dict[str, Path]:
    kept = os.environ.get("DFLASH_DOCTOR_VENVS")
    root = Path(kept) if kept else tmp_path_factory.mktemp("doctor-venvs")
    pythons = {name: root / name / "bin/python" for name in VARIANTS}
    if (root / ".complete").exists():
        return pythons
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root / "base")], check=True)
    pip(root / "base/bin/python", "-c", str(DATA / "constraints.txt"), *BASE)
    for name, wheels in VARIANTS.items():
        venv = root / name
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip(venv / "bin/python", "--no-deps", *wheels)
        (site_packages(venv) / "_base.pth").write_text(f"{site_packages(root / 'base')}\n")
    (root / ".complete").touch()
    return pythons


@pytest.fixture(scope="session")
def lock(venvs, tmp_path_factory) -> Path:
    """A lock for this system made from the good venv: what a correct host has."""
    out = subprocess.run([str(venvs["good"]), "-m", "pip", "list", "--format=json"], check=True,
                         capture_output=True, text=True).stdout
    from dflashctl.lock.lockfile import canonical_name
    from dflashctl.systems import current_system
    pkgs = {canonical_name(p["name"]): {"version": p["version"], "file": f"{p['name']}-{p['version']}-py3-none-any.whl",
                                        "size": 1, "sha256": "0" * 64, "dependencies": []}
            for p in json.loads(out) if canonical_name(p["name"]) not in ("pip", "setuptools")}
    lock = {"version": 1, "spec_sha256": "0" * 64, "python": "%d.%d" % sys.version_info[:2],
            "exclude_newer": "2026-11-30T00:00:00Z", "requirements": [],
            "systems": {current_system(): {"roots": ["xgrammar"], "packages": pkgs}}}
    path = tmp_path_factory.mktemp("lock") / "python-lock.json"
    path.write_text(json.dumps(lock))
    return path


@pytest.fixture(scope="session")
def reports(venvs, lock, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    out = tmp_path_factory.mktemp("fingerprints")
    done = {}
    for name, python in venvs.items():
        proc = doctor(python, lock, out / f"{name}.json")
        done[name] = (proc, json.loads((out / f"{name}.json").read_text()))
    return done


def statuses(fp: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in fp["checks"]}


def by_name(fp: dict, name: str) -> dict:
    return next(c for c in fp["checks"] if c["name"] == name)


# What no venv on a machine without a GPU and without SGLang can pass, whatever its packages.
NO_GPU_NO_SGLANG = {"driver", "libcuda", "torch", "sgl_kernel", "sglang"}


def test_the_good_venv_fails_only_for_what_this_host_lacks(reports):
    proc, fp = reports["good"]
    assert proc.returncode == 1, proc.stderr
    assert {n for n, s in statuses(fp).items() if s == "fail"} == NO_GPU_NO_SGLANG
    assert statuses(fp)["grammar:xgrammar"] == "ok" and statuses(fp)["soundfile"] == "ok"
    assert statuses(fp)["packages"] == "ok" and statuses(fp)["python"] == "ok"
    assert by_name(fp, "torch")["summary"].startswith("torch 2.13.0+cpu (CUDA none: CPU-only build")
    assert fp["probes"]["soundfile"]["facts"]["libsndfile"] == "1.2.2"


def test_the_old_xgrammar_venv_names_exactly_what_is_wrong(reports):
    proc, fp = reports["old"]
    assert proc.returncode == 1
    fails = {n for n, s in statuses(fp).items() if s == "fail"}
    assert fails == NO_GPU_NO_SGLANG | {"grammar:xgrammar", "soundfile", "packages"}
    assert by_name(fp, "grammar:xgrammar")["summary"] == \
        "xgrammar 0.1.10 lacks StructuralTag, StructuralTagItem (SGLang imports them)"
    assert by_name(fp, "soundfile")["summary"] == "soundfile is not installed"
    assert fp["lock"]["other_version"] == {"xgrammar": {"locked": "0.1.32", "installed": "0.1.10"}}
    assert set(fp["lock"]["missing"]) == {"soundfile", "cffi", "pycparser"}


def test_soundfile_without_cffi_reports_the_missing_backend(reports):
    _, fp = reports["nocffi"]
    check = by_name(fp, "soundfile")
    assert check["status"] == "fail" and "No module named '_cffi_backend'" in check["summary"]
    assert set(fp["lock"]["missing"]) == {"cffi", "pycparser"}


def normalise_table(text: str, venvs: dict, lock: Path) -> str:
    text = text.replace(str(lock), "<LOCK>")
    for name, python in venvs.items():
        text = text.replace(str(python.parent.parent.parent), "<VENVS>")
    text = re.sub(r"^(dflashctl doctor: \S+ \(Python )[^)]*\) on .*$", r"\1X.Y.Z) on <HOST>", text, flags=re.M)
    return re.sub(r"Python 3\.\d+\.\d+", "Python 3.X.Y", text)


def golden(name: str, text: str) -> None:
    path = DATA / name
    update_golden(path, text)
    assert text == path.read_text()


def test_venvs_installed_without_byte_code_are_told_their_first_start_compiles_it(reports):
    """The venvs are installed with --no-compile; the probes' own imports write some byte code."""
    check = by_name(reports["good"][1], "bytecode")
    assert check["status"] == "warn" and "the first start compiles them" in check["summary"]
    assert re.search(r"torch \d+/\d+", check["summary"]) and " -m compileall -q -j0 " in check["fix"]


def without_bytecode(fp: dict) -> dict:
    """The bytecode check counts what earlier runs on this machine happened to compile: it has its
    own test above, and the goldens leave it out."""
    return {**fp, "checks": [c for c in fp["checks"] if c["name"] != "bytecode"]}


@pytest.mark.golden
def test_golden_table(venvs, lock, reports, tmp_path):
    from dflashctl.host import doctor as doctor_module
    text = doctor_module.render(without_bytecode(reports["old"][1]))
    golden("old.table.golden", normalise_table(text, venvs, lock))


@pytest.mark.golden
def test_golden_json(venvs, lock, reports, tmp_path):
    proc = doctor(venvs["old"], lock, tmp_path / "again.json", "--json")
    fp = json.loads(proc.stdout)
    assert fp == json.loads((tmp_path / "again.json").read_text())
    stable = {"checks": [{k: c[k] for k in ("name", "status", "summary", "fix", "exit_code")}
                         for c in without_bytecode(fp)["checks"]],
              "lock": {k: v for k, v in fp["lock"].items() if k != "path"}}
    text = normalise_table(json.dumps(stable, indent=2, sort_keys=True) + "\n", venvs, lock)
    golden("old.json.golden", text)


def test_diff_puts_the_grammar_api_break_first_and_fails(reports, tmp_path):
    paths = {}
    for name in ("good", "old"):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(reports[name][1]))
    proc = diff(paths["good"], paths["old"], "--json")
    assert proc.returncode == 1
    rows = json.loads(proc.stdout)["differences"]
    failures = [r for r in rows if r["group"] == "failure"]
    assert [r["item"] for r in failures] == ["check packages", "check grammar:xgrammar", "check soundfile"]
    assert failures[1]["fix"] == "install the locked wheel: xgrammar 0.1.32"  # from the lock
    assert [r for r in rows if r["group"] == "abi"][0] == {
        "group": "abi", "item": "xgrammar names SGLang imports, missing", "a": "none",
        "b": "StructuralTag, StructuralTagItem"}
    versions = {r["item"]: (r["a"], r["b"]) for r in rows if r["group"] == "version"}
    assert versions == {"xgrammar": ("0.1.32", "0.1.10"), "soundfile": ("0.13.1", None),
                        "cffi": ("2.1.1", None), "pycparser": ("3.12", None)}
    groups = [r["group"] for r in rows]
    assert groups == sorted(groups, key=["failure", "abi", "version", "other"].index)
    table = diff(paths["good"], paths["old"]).stdout
    assert table.index("failures, root cause first (3)") < table.index("ABI-breaking (1)") \
        < table.index("versions (4)") < table.index("other (")
    assert "  fix: install the locked wheel: xgrammar 0.1.32" in table


def test_diff_of_two_runs_on_the_same_venv_has_no_abi_difference(venvs, lock, reports, tmp_path):
    again = tmp_path / "good-again.json"
    doctor(venvs["good"], lock, again)
    first = tmp_path / "good.json"
    first.write_text(json.dumps(reports["good"][1]))
    proc = diff(first, again, "--json")
    assert proc.returncode == 0, proc.stdout
    # The fast start's check is a trial with bounded waits (a template importing ~100 modules, a child
    # forked from it): the first run on a fresh venv, on a loaded machine, may find it not ready in
    # time where the second does. Everything the venv is (versions, ABI, checks) must be the same.
    differences = json.loads(proc.stdout)["differences"]
    assert [d for d in differences if d.get("item") != "check faststart"] == [], differences


def test_diff_refuses_a_file_that_is_not_a_fingerprint(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text("{}")
    proc = diff(bogus, bogus)
    assert proc.returncode == errors.INPUT and "is not a dflashctl fingerprint" in proc.stderr
    assert "Traceback" not in proc.stderr
