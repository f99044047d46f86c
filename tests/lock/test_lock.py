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


# --- contract.check on its own: hand-made locks, one rule broken at a time ----------------------

def wheel(name, version):
    return lockfile.LockedWheel(name, version, f"{name}-{version}-py3-none-any.whl", 1, "0" * 64)


STACK = {"torch": wheel("torch", "2.11.0"), "cuda-toolkit": wheel("cuda-toolkit", "13.0.2"),
         "triton": wheel("triton", "3.6.0"), "sglang-kernel": wheel("sglang-kernel", "0.4.2"),
         "xgrammar": wheel("xgrammar", "0.1.32"), "soundfile": wheel("soundfile", "0.13.1")}
TORCH_REQUIRES = ["cuda-toolkit[cublas]==13.0.2; platform_system == 'Linux'", "triton==3.6.0; platform_system == 'Linux'",
                  "nvidia-cudnn-cu13==9.19.0.56; platform_machine == 'x86_64'", "filelock", "sympy>=1.13.3",
                  "opt-einsum>=3.3; extra == 'opt-einsum'", "setuptools; python_version >= '3.12'"]
CONTRACT = specmod.Contract(torch="2.11.0", cuda="13.0", sglang_kernel="0.4.2", xgrammar="0.1.32",
                            required=("soundfile",))


def broken(packages=None, requires=TORCH_REQUIRES, contract=CONTRACT, system=X86):
    from dflashctl.lock import contract as contractmod
    return contractmod.check(contract, system, {**STACK, **(packages or {})} if packages is not None else STACK,
                             requires, "3.12")


def test_the_stack_keeps_the_contract_on_both_systems():
    assert broken() == [] and broken(system=ARM) == []


def test_torchs_requirements_follow_the_systems_markers():
    from dflashctl.lock import contract as contractmod
    x86 = contractmod.torch_requirements(TORCH_REQUIRES, X86, "3.12")
    assert list(x86) == ["cuda-toolkit", "triton", "nvidia-cudnn-cu13", "filelock", "sympy", "setuptools"]
    assert "setuptools" not in contractmod.torch_requirements(TORCH_REQUIRES, X86, "3.11")  # the lock's Python decides
    assert "nvidia-cudnn-cu13" not in contractmod.torch_requirements(TORCH_REQUIRES, ARM, "3.12")
    assert str(x86["cuda-toolkit"].specifier) == "==13.0.2"


@pytest.mark.parametrize("spec_, line", [("==13.0.2", "13.0.2"), ("==13.0.*", "13.0"), ("===13.0", "13.0"),
                                         (">=13.0", None), ("==13.0.2,<14", None), ("", None)])
def test_one_pin_is_a_line_anything_else_is_none(spec_, line):
    from packaging.requirements import Requirement

    from dflashctl.lock import contract as contractmod
    assert contractmod._pinned_line(Requirement(f"cuda-toolkit{spec_}")) == line


def test_a_version_in_a_line_compares_release_numbers():
    from dflashctl.lock import contract as contractmod
    assert contractmod._in_line("13.0.2", "13.0") and contractmod._in_line("13.0", "13.0")
    assert not contractmod._in_line("13.1.0", "13.0") and not contractmod._in_line("12.8.1", "13")
    assert not contractmod._in_line("13.0.2", "13.0.3") and not contractmod._in_line("x", "13.0")
    assert not contractmod._in_line("13.0", "y")


def test_each_rule_names_package_system_expectation_and_finding():
    no = {k: v for k, v in STACK.items() if k not in ("xgrammar", "soundfile")}
    from dflashctl.lock import contract as contractmod
    assert contractmod.check(CONTRACT, X86, no, TORCH_REQUIRES, "3.12") == [
        f"xgrammar on {X86}: expected 0.1.32, found no xgrammar in the lock",
        f"soundfile on {X86}: expected in the lock (the contract requires it), found nothing"]
    assert broken({"torch": wheel("torch", "2.10.0")}) == [f"torch on {X86}: expected 2.11.0, found 2.10.0"]
    assert broken({"sglang-kernel": wheel("sglang-kernel", "0.4.1")}) == [
        f"sglang-kernel on {X86}: expected 0.4.2, found 0.4.1"]
    assert broken(requires=[r for r in TORCH_REQUIRES if not r.startswith("cuda-toolkit")]) == [
        f"torch on {X86}: expected torch-2.11.0-py3-none-any.whl to require cuda-toolkit==13.0.*, found no CUDA "
        "toolkit requirement (a CPU build?)"]
    assert broken(requires=["cuda-toolkit>=12", "triton==3.6.0"]) == [
        f"torch on {X86}: expected torch-2.11.0-py3-none-any.whl to require cuda-toolkit==13.0.*, found "
        "cuda-toolkit>=12"]
    assert broken(requires=["cuda-toolkit==12.8.1", "triton==3.6.0"]) == [
        f"torch on {X86}: expected torch-2.11.0-py3-none-any.whl to require cuda-toolkit==13.0.*, found "
        "cuda-toolkit==12.8.1"]
    assert broken({"cuda-toolkit": wheel("cuda-toolkit", "12.8.1")}) == [
        f"cuda-toolkit on {X86}: expected 13.0.* (torch requires ==13.0.2), found 12.8.1"]
    none = {k: v for k, v in STACK.items() if k != "cuda-toolkit"}
    assert contractmod.check(CONTRACT, X86, none, TORCH_REQUIRES, "3.12") == [
        f"cuda-toolkit on {X86}: expected 13.0.* (torch requires ==13.0.2), found none"]


def test_the_triton_rule_wants_the_one_release_torch_pins():
    from dflashctl.lock import contract as c
    assert broken(requires=["cuda-toolkit==13.0.2"]) == [
        f"triton on {X86}: expected torch 2.11.0 to pin triton, found no triton requirement in "
        "torch-2.11.0-py3-none-any.whl"]
    assert broken(requires=["cuda-toolkit==13.0.2", "triton>=3.5"]) == [
        f"triton on {X86}: expected torch to pin one triton release, found triton>=3.5"]
    assert broken({"triton": wheel("triton", "3.5.1")}) == [
        f"triton on {X86}: expected ==3.6.0 (what torch 2.11.0 requires), found 3.5.1"]
    no_triton = {k: v for k, v in STACK.items() if k != "triton"}
    assert c.check(CONTRACT, X86, no_triton, TORCH_REQUIRES, "3.12") == [
        f"triton on {X86}: expected ==3.6.0 (what torch 2.11.0 requires), found none"]
    assert broken({"triton": wheel("triton", "3.6.0rc1")}, requires=["cuda-toolkit==13.0.2", "triton==3.6.0rc1"]) == []
    # a release candidate inside the pinned line keeps it (torch nightlies pin triton so)
    assert broken({"triton": wheel("triton", "3.6.0rc1")}, requires=["cuda-toolkit==13.0.2", "triton==3.6.*"]) == []
    # a requirement for the lock's Python (3.12) counts, the later line of a name wins
    assert broken(requires=[*TORCH_REQUIRES, "triton==3.7.*; python_version >= '3.12'"]) == [
        f"triton on {X86}: expected ==3.7.* (what torch 2.11.0 requires), found 3.6.0"]


def test_rules_without_their_facts_are_off():
    from dflashctl.lock import contract as c
    off = specmod.Contract()
    assert c.check(off, X86, {}, None, "3.12") == []
    no_torch = {k: v for k, v in STACK.items() if k != "torch"}
    assert c.check(dataclasses.replace(CONTRACT, torch=None), X86, no_torch, TORCH_REQUIRES, "3.12") == []
    assert c.check(CONTRACT, X86, STACK, None, "3.12") == []  # torch's metadata not fetched: its rules wait
    assert broken(requires=["triton==3.6.0"], contract=dataclasses.replace(CONTRACT, cuda=None)) == []


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


def test_every_kind_of_change_is_named_in_the_order_a_reader_cares_about():
    lock = build()
    old = _edited(lock, X86, "torch", sha256="f" * 64)  # re-hashed
    old = _edited(old, ARM, "numpy", version="9.0.0")  # downgraded (new is older)
    old = _edited(old, X86, "numpy", file="numpy-x.whl")  # same version, another file
    old = _edited(old, X86, "packaging", dependencies=("left-pad",))
    old = _edited(old, ARM, "torch", size=1)  # re-hashed by its size alone
    old.python, old.roots = "3.11", {**old.roots, X86: ["torch"]}
    changes = lockdiff.diff(old, lock)
    assert [(c.system, c.package, c.kind) for c in changes] == [
        (ARM, "torch", "re-hashed"), (X86, "torch", "re-hashed"), (ARM, "numpy", "downgraded"),
        (X86, "numpy", "re-wheeled"), (X86, "packaging", "deps"), ("*", "python", "setting"),
        (X86, "roots", "setting")]
    by = {(c.system, c.package): c for c in changes}
    t, a = lock.systems[X86]["torch"], lock.systems[ARM]["torch"]
    assert (by[X86, "torch"].old, by[X86, "torch"].new) == (f"{'f' * 16}… {t.size} B", f"{t.sha256[:16]}… {t.size} B")
    assert by[ARM, "torch"].old == f"{a.sha256[:16]}… 1 B"
    assert (by[ARM, "numpy"].old, by[ARM, "numpy"].new) == ("9.0.0", lock.systems[ARM]["numpy"].version)
    assert (by[X86, "numpy"].old, by[X86, "numpy"].new) == ("numpy-x.whl", lock.systems[X86]["numpy"].file)
    assert by[X86, "packaging"].old == "left-pad"
    assert by[X86, "packaging"].new == " ".join(sorted(lock.systems[X86]["packaging"].dependencies))
    assert (by["*", "python"].old, by["*", "python"].new) == ("3.11", lock.python)
    assert by[X86, "roots"].old == "torch" and by[X86, "roots"].new == " ".join(sorted(lock.roots[X86]))
    added = lockdiff.diff(lock, old)  # the other way round: an older version is an upgrade
    assert ("upgraded", "9.0.0") in {(c.kind, c.new) for c in added}
    assert lockdiff.as_json(changes)[0] == {"system": ARM, "package": "torch", "kind": "re-hashed",
                                            "old": f"{a.sha256[:16]}… 1 B", "new": f"{a.sha256[:16]}… {a.size} B"}


def test_added_removed_and_whole_systems_name_what_changed():
    lock = build()
    old = lockfile.parse(json.loads(lock.dumps()))
    gone = old.systems[X86].pop("pycparser")
    old.systems[X86]["left-pad"] = dataclasses.replace(lock.systems[X86]["packaging"], name="left-pad")
    old.systems[X86]["packaging"] = dataclasses.replace(old.systems[X86]["packaging"], dependencies=("a", "b"))
    old.systems["riscv64-linux"] = {"numpy": lock.systems[X86]["numpy"]}
    old.roots = {X86: lock.roots[X86]}  # none recorded for aarch64: every root is new there
    by = {(c.system, c.package): c for c in lockdiff.diff(old, lock)}
    assert (by[X86, "pycparser"].kind, by[X86, "pycparser"].old, by[X86, "pycparser"].new) == (
        "added", "", f"{gone.version} {gone.file}")
    left = lock.systems[X86]["packaging"]
    assert (by[X86, "left-pad"].kind, by[X86, "left-pad"].old, by[X86, "left-pad"].new) == (
        "removed", f"{left.version} {left.file}", "")
    assert (by[X86, "packaging"].kind, by[X86, "packaging"].old) == ("deps", "a b")
    assert by["riscv64-linux", "numpy"].kind == "removed"
    assert (by[ARM, "roots"].old, by[ARM, "roots"].new) == ("", " ".join(sorted(lock.roots[ARM])))
    assert by[ARM, "roots"].kind == "setting" and (X86, "roots") not in by
    table = lockdiff.table([by[X86, "left-pad"]]).splitlines()[1]
    assert table.split()[-1] == "-" and table.split()[2] == "removed"


def test_a_system_added_or_dropped_whole_lists_every_package_and_its_roots():
    lock = build()
    arm = lock.systems[ARM]
    without = lockfile.parse(json.loads(lock.dumps()))
    del without.systems[ARM], without.roots[ARM]
    added = {(c.package, c.kind, c.old, c.new) for c in lockdiff.diff(without, lock) if c.system == ARM}
    assert added == {("roots", "setting", "", "packaging sglang-kernel soundfile torch triton xgrammar"),
                     *{(n, "added", "", f"{w.version} {w.file}") for n, w in arm.items()}}
    dropped = {(c.package, c.kind, c.old, c.new) for c in lockdiff.diff(lock, without) if c.system == ARM}
    assert dropped == {("roots", "setting", "packaging sglang-kernel soundfile torch triton xgrammar", ""),
                       *{(n, "removed", f"{w.version} {w.file}", "") for n, w in arm.items()}}
    (deps,) = lockdiff.diff(lock, _edited(lock, X86, "packaging", dependencies=("b", "a")))
    assert (deps.kind, deps.old, deps.new) == ("deps", " ".join(sorted(lock.systems[X86]["packaging"].dependencies)),
                                               "a b")


def test_a_version_that_is_not_pep_440_counts_as_an_upgrade():
    lock = build()
    old = _edited(lock, X86, "numpy", version="not-a-version")
    (change,) = lockdiff.diff(old, lock)
    assert change.kind == "upgraded"


def test_the_diff_table_lines_up_its_columns():
    changes = [lockdiff.Change(X86, "torch", "re-hashed", "aaaa… 1 B", "bbbb… 2 B"),
               lockdiff.Change("*", "python", "setting", "", "3.12")]
    assert lockdiff.table(changes).splitlines() == [
        "SYSTEM        PACKAGE  CHANGE     OLD        NEW",
        "x86_64-linux  torch    re-hashed  aaaa… 1 B  bbbb… 2 B",
        "*             python   setting    -          3.12"]
    assert lockdiff.table([]) == "no changes"


# --- `lock --check` offline: the committed lock against a resolution given here ---------------

def check(tmp_path, committed_text: str, fresh, json_out=False, monkeypatch=None):
    from types import SimpleNamespace

    from dflashctl.lock import lock as lockcmd
    (tmp_path / "python-lock.json").write_text(committed_text)
    monkeypatch.setattr(lockcmd, "resolve", lambda spec, quiet, licences: fresh)
    args = SimpleNamespace(lock=tmp_path / "python-lock.json", spec="nix/stack.toml", json=json_out, quiet=True)
    return lockcmd._cmd_check(args, spec())


def test_check_passes_an_up_to_date_lock(tmp_path, monkeypatch, capsys):
    lock = build()
    assert check(tmp_path, lock.dumps(), lock, monkeypatch=monkeypatch) == 0
    assert "is up to date with nix/stack.toml" in capsys.readouterr().err
    assert check(tmp_path, lock.dumps(), lock, json_out=True, monkeypatch=monkeypatch) == 0
    assert json.loads(capsys.readouterr().out) == {"up_to_date": True, "changes": []}


@pytest.mark.parametrize("change", [{"sha256": "0" * 64}, {"size": 12345}], ids=["sha256", "size"])
def test_check_calls_an_edited_hash_or_size_tampering(tmp_path, monkeypatch, capsys, change):
    lock = build()
    forged = _edited(lock, ARM, "torch", **change)
    with pytest.raises(DflashError) as e:
        check(tmp_path, forged.dumps(), lock, monkeypatch=monkeypatch)
    assert e.value.what == f"{tmp_path / 'python-lock.json'} was tampered with"
    assert e.value.why == ("the sha256 or size of the same wheel file differs from the index for torch "
                           "(aarch64-linux); the index never changes a published file, so the lock was edited")
    assert e.value.fix == "restore the lock from git or regenerate it with `dflashctl lock`"
    assert e.value.exit_code == errors.FAILED
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == [ARM, "torch", "re-hashed"]


def test_check_calls_a_newer_resolution_stale_and_a_reformatted_lock_not_canonical(tmp_path, monkeypatch):
    lock = build()
    older = _edited(lock, X86, "numpy", version="1.0.0")
    with pytest.raises(DflashError) as e:
        check(tmp_path, older.dumps(), lock, monkeypatch=monkeypatch)
    assert e.value.what.endswith("python-lock.json is stale")
    assert e.value.why == "1 difference(s) from a fresh resolution of nix/stack.toml (table above)"
    assert e.value.fix == "run `dflashctl lock` and commit nix/stack.toml and the lock together"
    older.spec_sha256 = "0" * 64
    with pytest.raises(DflashError) as e:
        check(tmp_path, older.dumps(), lock, monkeypatch=monkeypatch)
    assert e.value.why.endswith("; stack.toml changed since the lock was written")
    with pytest.raises(DflashError) as e:
        check(tmp_path, json.dumps(json.loads(lock.dumps())), lock, monkeypatch=monkeypatch)  # same content, other text
    assert e.value.what.endswith("is not in canonical form") and e.value.exit_code == errors.FAILED


def test_check_json_lists_the_changes_of_a_tampered_lock(tmp_path, monkeypatch, capsys):
    """With --json the failure's error object carries the comparison (cli prints it)."""
    lock = build()
    with pytest.raises(DflashError) as e:
        check(tmp_path, _edited(lock, X86, "torch", sha256="0" * 64).dumps(), lock, json_out=True,
              monkeypatch=monkeypatch)
    assert capsys.readouterr().out == ""  # no table in front of the JSON
    out = e.value.result
    assert out["up_to_date"] is False and [c["kind"] for c in out["changes"]] == ["re-hashed"]


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
