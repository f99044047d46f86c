"""The story's two hosts (tests/storyhosts.py): one doctor run, one diff and one serve on host B name
all four causes (torch for CUDA 12.8, sgl_kernel linked against another torch, xgrammar 0.1.10,
no soundfile), each with its fix."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import storyhosts
from dflashctl import errors
from doctor_cli import diff, doctor
from serve_fixture import NEVER, Notify, free_port

pytestmark = pytest.mark.skipif(not storyhosts.shutil.which("gcc"), reason="needs gcc to build the hosts' libraries")
CAUSES = ["torch", "sgl_kernel", "grammar:xgrammar", "soundfile"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("story-hosts")
    pythons = {name: storyhosts.build_host(root, name) for name in storyhosts.HOSTS}
    pythons["lock"] = storyhosts.lock_from(pythons["A"], root / "python-lock.json")
    return pythons


@pytest.fixture(scope="module")
def fingerprints(hosts, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    out = tmp_path_factory.mktemp("story-fingerprints")
    return {name: (doctor(hosts[name], hosts["lock"], out / f"{name}.json"), out / f"{name}.json")
            for name in ("A", "B")}


def checks(path: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(path.read_text())["checks"]}


def assert_the_four_causes(found: dict[str, dict]) -> None:
    """Each cause named as the story's host showed it, with a fix that names the locked version."""
    torch, kernel, grammar, sound = (found[n] for n in CAUSES)
    assert torch["summary"].startswith("torch 2.9.1+cu128 (CUDA 12.8") and "not a CUDA 13.x build" in torch["summary"]
    assert "torch 2.11.0" in torch["fix"]
    assert (f"undefined symbol {storyhosts.DEMANGLED} ({storyhosts.NEEDED})" in kernel["summary"]
            and "sm90/common_ops.abi3.so does not load" in kernel["summary"]
            and "built against another torch than torch 2.9.1+cu128" in kernel["summary"]), kernel["summary"]
    assert "sglang-kernel 0.4.2 is built for torch 2.11.0" in kernel["fix"]
    assert "dflashctl export" in kernel["fix"] and "nix profile install .#dflash-env" in kernel["fix"]
    assert grammar["summary"] == "xgrammar 0.1.10 lacks StructuralTag, StructuralTagItem (SGLang imports them)"
    assert grammar["fix"] == "install the locked wheel: xgrammar 0.1.32"
    assert sound["summary"] == "soundfile is not installed" and "soundfile 0.13.1" in sound["fix"]
    assert all(found[n]["status"] == "fail" for n in CAUSES)


def test_host_a_passes_where_b_fails(fingerprints):
    found = checks(fingerprints["A"][1])
    assert {n: found[n]["status"] for n in CAUSES} == dict.fromkeys(CAUSES, "ok")
    assert found["sgl_kernel"]["summary"] == "sglang-kernel 0.4.2: sm90/common_ops loads (torch 2.11.0+cu130)"
    assert found["packages"]["status"] == "ok"


def test_one_doctor_run_on_b_names_all_four_causes_with_their_fixes(fingerprints):
    proc, path = fingerprints["B"]
    assert proc.returncode == errors.FAILED and "Traceback" not in proc.stderr
    found = checks(path)
    assert_the_four_causes(found)
    kernel = found["sgl_kernel"]["details"]
    assert kernel["undefined_symbol"] == storyhosts.NEEDED
    assert kernel["undefined_symbol_demangled"] == storyhosts.DEMANGLED
    table = proc.stdout
    for name in CAUSES:  # each failing row is followed by its fix
        row = next(i for i, line in enumerate(table.splitlines()) if line.startswith(f"fail  {name} "))
        assert table.splitlines()[row + 1].strip().startswith("fix: ")
    assert storyhosts.DEMANGLED in table


def test_diff_a_b_lists_the_failures_first_with_their_fixes(fingerprints):
    a, b = fingerprints["A"][1], fingerprints["B"][1]
    proc = diff(a, b, "--json")
    assert proc.returncode == errors.FAILED
    rows = json.loads(proc.stdout)["differences"]
    failures = [r for r in rows if r["group"] == "failure"]
    assert rows[:len(failures)] == failures  # before every ABI, version and other row
    by_item = {r["item"]: r for r in failures}
    assert set(by_item) == {f"check {n}" for n in CAUSES} | {"check packages"}
    assert_the_four_causes({n: {**by_item[f"check {n}"], "status": by_item[f"check {n}"]["b"]} for n in CAUSES})
    assert all(r["a"] == "ok" and r["fails_on"] == "b" for r in failures)
    kernel_row = next(r for r in rows if r["item"] == "sgl_kernel common_ops against torch")
    assert kernel_row == {"group": "abi", "item": "sgl_kernel common_ops against torch", "a": "sm90",
                          "b": f"fails: undefined symbol {storyhosts.DEMANGLED}"}
    table = diff(a, b).stdout
    assert table.startswith("failures, root cause first (5)")
    assert table.index("check soundfile") < table.index("ABI-breaking") < table.index("versions (")
    assert table.count("  fix: ") == 5


def test_serve_on_b_lists_all_four_before_exiting(hosts, tmp_path):
    """A real serve process with a real notify socket: every failure with its fix, in the status
    and the log, exit with the first one's code, and SGLang never started."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"name": "b", "model": "stand-in", "port": free_port()}))
    notify = Notify(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), PYTHONPATH=str(storyhosts.REPO / "python"))
    proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "serve", "--config", str(settings),
                             "--python", str(hosts["B"]), "--launcher", f"{sys.executable} -c 'raise SystemExit(9)'",
                             "--log-file", str(tmp_path / "sglang.log")],
                            cwd=storyhosts.REPO,  # where serve finds nix/python-lock.json today
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=NEVER)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    notify.drain()
    status = [m for m in notify.messages if m.startswith("STATUS=preflight: ")][-1]
    lines = [line.strip().lstrip("| ") for line in err.splitlines()]
    listed = [line.split(". ", 1)[1].split(": ")[0] for line in lines if line[:1].isdigit() and ". " in line]
    assert set(CAUSES) <= set(listed), err
    for i, name in enumerate(listed, 1):
        assert f"{i}. {name}: " in status
    assert sum(line.startswith("fix: ") for line in lines) == len(listed) + 1  # + the closing advice
    assert status.count("fix: ") == len(listed)
    assert storyhosts.DEMANGLED in err and storyhosts.DEMANGLED in status
    assert "xgrammar 0.1.32" in status  # the version from the repository's lock
    assert f"dflashctl doctor --python {hosts['B']}" in status and "dflashctl doctor" in err
    assert "SGLang was not started" in err and not (tmp_path / "sglang.log").exists()
    first = {"driver": errors.PREFLIGHT_DRIVER, "libcuda": errors.PREFLIGHT_NATIVE,
             "libnuma": errors.PREFLIGHT_NATIVE, "torch": errors.PREFLIGHT_TORCH}[listed[0]]
    assert proc.returncode == first
