"""Offline tests of `dflashctl lock` on a captured uv.lock of a small real stack (tests/data/lock)."""

import dataclasses
import json
import random

import pytest
from lockfixtures import DATA, build, package, spec, torch_requires, uv_lock

from dflashctl import errors
from dflashctl.errors import DflashError
from dflashctl.lock import lockdiff, lockfile
from dflashctl.lock import spec as specmod
from dflashctl.lock.wheels import best_wheel, tag_priority

X86, ARM = "x86_64-linux", "aarch64-linux"


def violations(excinfo) -> list[str]:
    return [line.strip()[2:] for line in excinfo.value.why.splitlines() if line.strip()]


# --- wheel selection -------------------------------------------------------------------------

def test_each_system_gets_its_own_cp312_wheel():
    lock = build()
    assert lock.systems[X86]["torch"].file == "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    assert lock.systems[ARM]["torch"].file == "torch-2.11.0-cp312-cp312-manylinux_2_28_aarch64.whl"
    assert (lock.systems[ARM]["triton"].file
            == "triton-3.6.0-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl")
    # abi3 wheel built for cp310 is valid for cp312; manylinux2014 is an alias of 2_17.
    assert lock.systems[X86]["sglang-kernel"].file == "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl"


def test_platform_wheel_beats_pure_wheel():
    # soundfile ships py2.py3-none-any and manylinux_2_28 wheels; pip prefers the platform one.
    lock = build()
    assert lock.systems[X86]["soundfile"].file == "soundfile-0.13.1-py2.py3-none-manylinux_2_28_x86_64.whl"
    assert lock.systems[ARM]["soundfile"].file == "soundfile-0.13.1-py2.py3-none-manylinux_2_28_aarch64.whl"


def test_no_chosen_wheel_names_another_arch_or_python():
    lock = build()
    for system, other in ((X86, "aarch64"), (ARM, "x86_64")):
        for w in lock.systems[system].values():
            assert other not in w.file
            assert not any(t in w.file for t in ("cp311-cp311", "cp313", "cp314"))


def test_manylinux_floor_is_an_upper_bound():
    prio = tag_priority(X86, "3.12", (2, 34))
    files = ["a-1-cp312-cp312-manylinux_2_17_x86_64.whl", "a-1-cp312-cp312-manylinux_2_35_x86_64.whl"]
    assert best_wheel(files, prio) == "a-1-cp312-cp312-manylinux_2_17_x86_64.whl"
    files.append("a-1-cp312-cp312-manylinux_2_34_x86_64.whl")
    assert best_wheel(files, prio) == "a-1-cp312-cp312-manylinux_2_34_x86_64.whl"
    assert best_wheel(["a-1-cp312-cp312-manylinux_2_35_x86_64.whl"], prio) is None


def test_legacy_manylinux1_only_on_x86_64():
    f = ["a-1-cp312-cp312-manylinux1_x86_64.whl"]
    assert best_wheel(f, tag_priority(X86, "3.12", (2, 34))) == f[0]
    assert best_wheel(["a-1-cp312-cp312-manylinux1_aarch64.whl"], tag_priority(ARM, "3.12", (2, 34))) is None


# --- markers and extras ----------------------------------------------------------------------

def test_markers_evaluated_per_system():
    lock = build()
    # xgrammar: `triton; platform_machine == 'x86_64'`
    assert "triton" in lock.systems[X86]["xgrammar"].dependencies
    assert "triton" not in lock.systems[ARM]["xgrammar"].dependencies
    # cffi: `pycparser; implementation_name != 'PyPy'` holds for CPython everywhere
    assert "pycparser" in lock.systems[ARM]["cffi"].dependencies


def test_a_marker_false_everywhere_drops_the_package():
    uv = uv_lock()
    for dep in package(uv, "cffi")["dependencies"]:
        if dep["name"] == "pycparser":
            dep["marker"] = "implementation_name == 'pypy'"
    lock = build(uv)
    assert "pycparser" not in lock.systems[X86] and "pycparser" not in lock.systems[ARM]


def test_extras_followed_through_optional_dependencies():
    lock = build()
    # cuda-toolkit[cufile] is the only way to nvidia-cufile
    assert "nvidia-cufile" in lock.systems[X86]["cuda-toolkit"].dependencies
    assert "nvidia-cufile" in lock.systems[X86]
    uv = uv_lock()
    for dep in package(uv, "torch")["dependencies"]:
        dep.pop("extra", None)
    assert "nvidia-cufile" not in build(uv).systems[X86]


def test_roots_and_dependency_names_are_in_the_lock():
    lock = build()
    for system, pkgs in lock.systems.items():
        assert lock.roots[system] == ["packaging", "sglang-kernel", "soundfile", "torch", "triton", "xgrammar"]
        for w in pkgs.values():
            assert set(w.dependencies) <= set(pkgs), w.name


# --- the ABI contract: one test per rule -----------------------------------------------------

def test_rule_torch_version():
    sp = dataclasses.replace(spec(), contract=dataclasses.replace(spec().contract, torch="2.10.0"))
    with pytest.raises(DflashError) as e:
        build(sp=sp)
    assert violations(e) == [f"torch on {s}: expected 2.10.0, found 2.11.0" for s in (X86, ARM)]


def test_rule_torch_requires_cuda_13_0_toolkit():
    req = torch_requires()
    req[ARM] = [r.replace("==13.0.2", "==12.8.1") if r.startswith("cuda-toolkit") else r for r in req[ARM]]
    with pytest.raises(DflashError) as e:
        build(requires=req)
    (msg,) = violations(e)
    assert msg.startswith("torch on aarch64-linux: expected torch-2.11.0-cp312-cp312-manylinux_2_28_aarch64.whl"
                          " to require cuda-toolkit==13.0.*")
    assert msg.endswith("found cuda-toolkit==12.8.1")


def test_rule_cpu_torch_is_refused():
    req = torch_requires()
    req[X86] = [r for r in req[X86] if not r.startswith("cuda-toolkit")]
    with pytest.raises(DflashError) as e:
        build(requires=req)
    assert violations(e) == ["torch on x86_64-linux: expected torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
                             " to require cuda-toolkit==13.0.*, found no CUDA toolkit requirement (a CPU build?)"]


def test_rule_triton_is_what_torch_requires():
    req = torch_requires()
    req[X86] = [r.replace("triton==3.6.0", "triton==3.5.1") for r in req[X86]]
    with pytest.raises(DflashError) as e:
        build(requires=req)
    assert violations(e) == ["triton on x86_64-linux: expected ==3.5.1 (what torch 2.11.0 requires), found 3.6.0"]


def test_rule_sglang_kernel_version():
    sp = dataclasses.replace(spec(), contract=dataclasses.replace(spec().contract, sglang_kernel="0.4.1"))
    with pytest.raises(DflashError) as e:
        build(sp=sp)
    assert violations(e) == [f"sglang-kernel on {s}: expected 0.4.1, found 0.4.2" for s in (X86, ARM)]


def test_rule_xgrammar_version():
    sp = dataclasses.replace(spec(), contract=dataclasses.replace(spec().contract, xgrammar="0.1.10"))
    with pytest.raises(DflashError) as e:
        build(sp=sp)
    assert violations(e) == [f"xgrammar on {s}: expected 0.1.10, found 0.1.32" for s in (X86, ARM)]


def test_rule_soundfile_present():
    uv = uv_lock()
    root = next(p for p in uv["package"] if "virtual" in p["source"])
    root["dependencies"] = [d for d in root["dependencies"] if d["name"] != "soundfile"]
    with pytest.raises(DflashError) as e:
        build(uv)
    assert violations(e) == [f"soundfile on {s}: expected in the lock (the contract requires it), found nothing"
                             for s in (X86, ARM)]


def test_rule_one_version_per_package_per_system():
    uv = uv_lock()
    second = dict(package(uv, "packaging"), version="25.0")
    uv["package"].append(second)
    for dep in package(uv, "transformers")["dependencies"]:
        if dep["name"] == "packaging":
            dep["version"] = "25.0"
    with pytest.raises(DflashError) as e:
        build(uv)
    assert violations(e) == [f"packaging: one version per system expected on {s}, found 25.0, 26.2"
                             for s in (X86, ARM)]


def test_rule_a_wheel_for_every_system():
    uv = uv_lock()
    kernel = package(uv, "sglang-kernel")
    kernel["wheels"] = [w for w in kernel["wheels"] if "aarch64" not in w["url"]]
    with pytest.raises(DflashError) as e:
        build(uv)
    assert violations(e) == ["sglang-kernel 0.4.2: a wheel for aarch64-linux (cp312, manylinux <= 2_34) expected,"
                             " found sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl",
                             # and, since it cannot be installed there, the kernel rule fails too
                             "sglang-kernel on aarch64-linux: expected 0.4.2, found no sglang-kernel in the lock"]


def test_rule_never_an_sdist():
    uv = uv_lock()
    del package(uv, "packaging")["wheels"]
    with pytest.raises(DflashError) as e:
        build(uv)
    assert violations(e) == [f"packaging 26.2: a wheel for {s} (cp312, manylinux <= 2_34) expected, found only an sdist"
                             for s in (X86, ARM)]


def test_every_broken_rule_reported_at_once():
    sp = dataclasses.replace(spec(), contract=dataclasses.replace(spec().contract, torch="2.9.0", xgrammar="0.1.10"))
    with pytest.raises(DflashError) as e:
        build(sp=sp)
    assert len(violations(e)) == 4
    assert "lock was not written" in e.value.fix


# --- determinism and the lock text -----------------------------------------------------------

def test_same_input_gives_byte_identical_lock():
    assert build().dumps() == build().dumps()


def test_uv_lock_order_does_not_matter():
    uv = uv_lock()
    rng = random.Random(7)
    rng.shuffle(uv["package"])
    for p in uv["package"]:
        rng.shuffle(p.get("wheels", []))
        rng.shuffle(p.get("dependencies", []))
    assert build(uv).dumps() == build().dumps()


def test_lock_round_trips_and_names_no_url():
    text = build().dumps()
    assert lockfile.parse(json.loads(text)).dumps() == text
    assert "://" not in text and "/" not in "".join(
        w.file for pkgs in build().systems.values() for w in pkgs.values())


def test_spec_hash_is_of_the_file_bytes():
    import hashlib
    assert build().spec_sha256 == hashlib.sha256((DATA / "stack.toml").read_bytes()).hexdigest()


# --- tamper detection and diff ---------------------------------------------------------------

def _edited(lock, system, name, **changes):
    edited = lockfile.parse(json.loads(lock.dumps()))
    edited.systems[system][name] = dataclasses.replace(edited.systems[system][name], **changes)
    return edited


def test_changed_hash_is_tampering_not_an_update():
    lock = build()
    forged = _edited(lock, X86, "torch", sha256="0" * 64)
    (change,) = lockdiff.diff(forged, lock)
    assert (change.system, change.package, change.kind) == (X86, "torch", "re-hashed")


def test_diff_kinds():
    lock = build()
    old = _edited(lock, ARM, "numpy", version="1.0.0")
    del old.systems[X86]["pycparser"]
    old.systems[X86]["left-pad"] = dataclasses.replace(lock.systems[X86]["packaging"], name="left-pad")
    kinds = {(c.system, c.package): c.kind for c in lockdiff.diff(old, lock)}
    assert kinds == {(ARM, "numpy"): "upgraded", (X86, "pycparser"): "added", (X86, "left-pad"): "removed"}
    assert "upgraded" in lockdiff.table(lockdiff.diff(old, lock))
    assert lockdiff.diff(lock, lock) == []


# --- the spec --------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, complaint", [
    (lambda t: t.replace('"aarch64-linux"', '"riscv64-linux"'), "unknown system 'riscv64-linux'"),
    (lambda t: t.replace('python = "3.12"', 'python = 3.12'), "`python` must be a str"),
    (lambda t: t.replace('"torch==2.11.0"', '"torch>=>2"'), "is not PEP 508"),
    (lambda t: t.replace("[contract]", "[contract"), "TOML error"),
    (lambda t: t.replace('manylinux = "2_34"\n', ""), "missing key `manylinux`"),
    (lambda t: t.replace("2026-05-08T00:00:00Z", "last tuesday"), "`exclude-newer` must be a UTC time"),
])
def test_malformed_spec_is_one_clear_error(edit, complaint):
    text = edit((DATA / "stack.toml").read_text())
    with pytest.raises(DflashError) as e:
        specmod.parse(text.encode(), "stack.toml")
    assert complaint in str(e.value)


# --- the command line (offline paths) ---------------------------------------------------------

def _cli(*args, cwd):
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=str(DATA.parents[2] / "python"))
    return subprocess.run([sys.executable, "-m", "dflashctl", "lock", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_cli_diff_table_and_json(tmp_path):
    new = build()
    old = _edited(new, ARM, "torch", sha256="0" * 64)
    (tmp_path / "old.json").write_text(old.dumps())
    (tmp_path / "new.json").write_text(new.dumps())
    table = _cli("--diff", "old.json", "new.json", cwd=tmp_path)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == ["SYSTEM", "PACKAGE", "CHANGE", "OLD", "NEW"]
    assert table.stdout.splitlines()[1].split()[:3] == [ARM, "torch", "re-hashed"]
    as_json = _cli("--diff", "old.json", "new.json", "--json", cwd=tmp_path)
    (change,) = json.loads(as_json.stdout)
    assert change["kind"] == "re-hashed" and change["package"] == "torch"


def test_cli_malformed_spec_fails_without_traceback(tmp_path):
    (tmp_path / "stack.toml").write_text((DATA / "stack.toml").read_text().replace('"x86_64-linux"', '"x86-linux"'))
    r = _cli("--spec", "stack.toml", "--lock", "lock.json", cwd=tmp_path)
    assert r.returncode == errors.INPUT and "Traceback" not in r.stderr
    assert r.stderr.startswith("dflashctl lock: stack.toml is not a valid stack spec: unknown system 'x86-linux'")
    assert not (tmp_path / "lock.json").exists()


# --- dev group and licences --------------------------------------------------------------------

def test_dev_group_is_resolved_with_the_stack_and_kept_apart():
    lock = build()
    for system in (X86, ARM):
        assert lock.dev_roots[system] == ["pytest"]
        every, stack = lock.packages(system, dev=True), lock.packages(system)
        assert {n for n, w in every.items() if w.dev} == {"pytest", "pluggy", "iniconfig", "pygments"} - set(stack)
        assert not any(w.dev for w in stack.values())
        # pytest needs packaging, which the stack has: one resolution, one version, not dev.
        assert "packaging" in every["pytest"].dependencies and not every["packaging"].dev
    data = json.loads(lock.dumps())["systems"][X86]
    assert data["dev_roots"] == ["pytest"]
    assert data["packages"]["pytest"]["dev"] is True and "dev" not in data["packages"]["torch"]
    assert lockfile.parse(json.loads(lock.dumps())) == lock


def test_every_locked_wheel_carries_its_licence():
    lock = build()
    for system in (X86, ARM):
        pkgs = lock.systems[system]
        assert all(w.license for w in pkgs.values())
        assert pkgs["torch"].license == "BSD-3-Clause"
        assert pkgs["triton"].license == "MIT"  # classifier only
        assert pkgs["soundfile"].license == "BSD-3-Clause"  # "BSD 3-Clause License" beats "BSD License"
        assert pkgs["sglang-kernel"].license == "Apache-2.0"  # full licence text in License
        assert pkgs["packaging"].license == "Apache-2.0 OR BSD-2-Clause"
        nvidia = {n for n, w in pkgs.items() if w.license.startswith("LicenseRef-NVIDIA")}
        assert {"nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "cuda-toolkit",
                "cuda-bindings"} <= nvidia
        assert not {"torch", "triton", "sglang-kernel"} & nvidia


@pytest.mark.parametrize("headers, expected", [
    ("License-Expression: MIT OR Apache-2.0\nLicense: BSD\n", "MIT OR Apache-2.0"),
    ("Classifier: License :: OSI Approved :: MIT License\n", "MIT"),
    ("License: Apache 2.0 License\n", "Apache-2.0"),
    ("License: MPL-2.0 AND MIT\n", "MPL-2.0 AND MIT"),
    ("License: NVIDIA Proprietary Software\nAuthor-email: cuda_installer@nvidia.com\n",
     "LicenseRef-NVIDIA-Proprietary"),
    ("Classifier: License :: Other/Proprietary License\nAuthor: Someone Else\n", "LicenseRef-Proprietary"),
    ("Author-email: compute_installer@nvidia.com\n", "LicenseRef-NVIDIA-Proprietary"),
    ("Author: nobody\n", "LicenseRef-Unknown"),
    ("License: Some words that are not a licence\n", "LicenseRef-Unknown"),
    ("License: MIT License\n        \n        Copyright (c) 2022 OpenAI\n", "MIT"),
    # A whole licence text in License: its words ("License Agreement") are not a verdict.
    ("License: Apache License\n        Version 2.0 ... Contributor License Agreement ...\n"
     "Classifier: License :: OSI Approved :: Apache Software License\n", "Apache-2.0"),
])
def test_licence_from_metadata_headers(headers, expected):
    from dflashctl.lock.licenses import license_of
    assert license_of(f"Metadata-Version: 2.1\nName: x\n{headers}\nREADME body: MIT\n") == expected


def test_unfree_rule_matches_nix():
    from dflashctl.lock.licenses import is_unfree
    assert is_unfree("LicenseRef-NVIDIA-SOFTWARE-LICENSE") and is_unfree("MIT OR LicenseRef-Proprietary")
    assert not is_unfree("MIT") and not is_unfree("LicenseRef-Unknown") and not is_unfree("LicenseRef-BSD")


def test_lock_tells_the_user_to_audit_after_a_change(tmp_path, monkeypatch, capsys):
    import argparse

    from dflashctl.lock import lock as lockcmd

    monkeypatch.setattr(lockcmd, "resolve", lambda spec, quiet, known=None: build())
    args = argparse.Namespace(diff=None, check=False, spec=DATA / "stack.toml", lock=tmp_path / "l.json",
                              json=False, quiet=True)
    assert lockcmd.run(args) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "next: `dflashctl audit`" in out
    assert "unfree" in out and "for the dev shell" in out
    assert lockcmd.run(args) == 0  # unchanged: nothing new to audit
    assert "dflashctl audit" not in capsys.readouterr().out


def test_relocking_reads_only_new_wheels_licences(tmp_path):
    from dflashctl.lock.lock import known_licenses

    lock = build()
    (tmp_path / "l.json").write_text(lock.dumps())
    known = known_licenses(tmp_path / "l.json")
    assert known["torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"] == "BSD-3-Clause"
    assert len(known) == len({w.file for pkgs in lock.systems.values() for w in pkgs.values()})
    assert known_licenses(tmp_path / "missing.json") == {}
