"""Triton's kernels built ahead: a recording made where the kernel is compiled, the build of that
recording on this CPU machine into Triton's own cache layout, and the read-only layer
(dflash_triton_cache.PrebuiltFirst) that Triton then finds them in without writing anything.

These compile a toy @triton.jit kernel for sm90 with the real Triton wheel (as the stack locks it)
and an explicit GPUTarget, so no GPU is needed; every child is this interpreter.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import kernels, triton_kernels
from dflashctl.lock import elf

pytest.importorskip("triton", reason="Triton is not installed (the test extra pins triton==3.6.0)")
CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(not CC, reason="no C compiler for Triton's helper modules")

TOY = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
'''
SIGNATURE = {"x_ptr": "*bf16", "y_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"}

# What the runtime does at a kernel's first call on an H200 (or, with TOY_ARCH, a GPU of that
# compute capability: 100 a B200, 120 an RTX PRO 6000), without the GPU: the specialisation (types,
# 16-divisible pointers, the constexpr) spelt out, the target named, and only the options the
# launch gives (the runtime passes its launch options to the target's parse_options). Prints one
# JSON line: the kernel's cache key and where Triton's cache manager finds the cuda_utils helper.
COMPILE = r'''
import hashlib, json, os, sysconfig
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from triton.runtime.build import platform_key
from triton.runtime.cache import get_cache_manager
from triton.backends.nvidia import driver as nv
import toykern

src = ASTSource(toykern.add_kernel, %r, {(4,): 1024},
                {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
kernel = triton.compile(src, target=GPUTarget("cuda", int(os.environ.get("TOY_ARCH", "90")), 32),
                        options={"num_warps": 4})
# compile_module_from_src's own key for cuda_utils (triton/runtime/build.py)
helper = hashlib.sha256((open(os.path.join(nv.dirname, "driver.c")).read() + platform_key()).encode()).hexdigest()
found = get_cache_manager(helper).get_file("cuda_utils" + sysconfig.get_config_var("EXT_SUFFIX"))
print(json.dumps({"hash": kernel.hash, "cuda_utils": found}), flush=True)
''' % (SIGNATURE,)


def child_env(tmp: Path, toy: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "DFLASH_"))}
    env.update(PYTHONPATH=str(toy), HOME=str(tmp / "home"), CUDA_VISIBLE_DEVICES="")
    env.update(extra)
    return env


def compile_toy(env: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def with_hook(env: dict) -> dict:
    return dict(env, PYTHONPATH=os.pathsep.join([str(kernels.HOOK_DIR), env["PYTHONPATH"]]),
                TRITON_CACHE_MANAGER=triton_kernels.MANAGER)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The toy kernel compiled once with the recording on, as on a GPU host."""
    tmp = tmp_path_factory.mktemp("triton")
    toy = tmp / "toy"
    toy.mkdir()
    (toy / "toykern.py").write_text(TOY)
    rec = tmp / "rec.jsonl"
    env = with_hook(child_env(tmp, toy, TRITON_CACHE_DIR=str(tmp / "w"), DFLASH_TRITON_RECORD=str(rec)))
    done = compile_toy(env)
    return tmp, toy, rec, done


@pytest.fixture(scope="module")
def built(recorded):
    """That recording built into a prebuilt directory, which is then moved elsewhere (as a store
    path is copied to the GPU host): the paths Triton wrote in its group files no longer exist."""
    if not CC:
        pytest.skip("no C compiler for Triton's helper modules")
    tmp, toy, rec, done = recorded
    records = triton_kernels.read_records([rec])
    stub = kernels.libcuda_stub(dict(os.environ), tmp / "stub", always=True)
    out = tmp / "out"
    result = triton_kernels.build(sys.executable, out, "9.0", records, child_env(tmp, toy), stub)
    layout = files(out)
    moved = tmp / "elsewhere" / "prebuilt"
    moved.parent.mkdir()
    out.rename(moved)
    return tmp, toy, done, layout, moved, result


def test_the_recording_names_the_kernel_its_key_and_its_specialisation(recorded):
    tmp, toy, rec, done = recorded
    [line] = rec.read_text().splitlines()
    r = json.loads(line)
    assert r["format"] == 1 and (r["module"], r["qualname"]) == ("toykern", "add_kernel")
    assert r["hash"] == done["hash"]
    assert r["signature"] == [list(kv) for kv in SIGNATURE.items()]  # in the kernel's argument order
    assert r["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert r["constants"] == [[[4], 1024]] and r["options"]["num_warps"] == 4
    assert triton_kernels.read_records([rec, rec]) == [r]  # one kernel however often it is recorded


@needs_cc
def test_the_build_stores_the_kernel_and_its_helpers_where_triton_finds_them_read_only(built):
    tmp, toy, done, layout, moved, result = built
    assert result == {"built": [done["hash"]], "carried": [], "stale": [], "failed": []}
    assert files(moved) == layout
    names = [Path(f).name for f in layout if f.startswith("triton/")]
    assert "__grp__add_kernel.json" in names and "add_kernel.cubin" in names
    suffix = ".cpython-%d%d" % sys.version_info[:2]
    assert sorted(n.split(suffix)[0] for n in names if n.endswith(".so")) == ["__triton_launcher", "cuda_utils"]
    [group] = (moved / "triton").rglob("__grp__add_kernel.json")
    assert not any(map(os.path.exists, json.loads(group.read_text())["child_paths"].values()))  # moved
    before = [(f, (moved / f).stat().st_mtime_ns) for f in files(moved)]

    writable = tmp / "w-hit"
    hit = compile_toy(with_hook(child_env(tmp, toy, TRITON_CACHE_DIR=str(writable),
                                          DFLASH_PREBUILT_KERNELS=str(moved))))
    assert hit["hash"] == done["hash"]
    assert files(writable) == []  # nothing compiled, nothing written
    assert hit["cuda_utils"] and Path(hit["cuda_utils"]).is_relative_to(moved / "triton")
    assert [(f, (moved / f).stat().st_mtime_ns) for f in files(moved)] == before

    # The same compile with Triton's own manager does write: the assertions above can fail.
    default = tmp / "w-default"
    plain = compile_toy(child_env(tmp, toy, TRITON_CACHE_DIR=str(default), DFLASH_PREBUILT_KERNELS=str(moved)))
    assert plain["hash"] == done["hash"]
    assert any(Path(f).name == "__grp__add_kernel.json" for f in files(default))
    assert plain["cuda_utils"] is None  # Triton's own manager does not look in the prebuilt directory


@needs_cc
def test_the_helper_modules_still_need_the_drivers_libcuda(built):
    tmp, toy, done, layout, moved, result = built
    modules = sorted((moved / "triton").rglob("*.so"))
    assert len(modules) == 2
    for so in modules:
        with open(so, "rb") as f:
            assert "libcuda.so.1" in elf.read(f).needed, so  # linked against the empty stub


@needs_cc
def test_a_prebuilt_entry_missing_a_file_is_a_miss(built, tmp_path):
    tmp, toy, done, layout, moved, result = built
    partial = tmp_path / "partial"
    shutil.copytree(moved, partial, symlinks=True)
    [cubin] = partial.rglob("add_kernel.cubin")
    cubin.unlink()
    writable = tmp_path / "w"
    miss = compile_toy(with_hook(child_env(tmp_path, toy, TRITON_CACHE_DIR=str(writable),
                                           DFLASH_PREBUILT_KERNELS=str(partial))))
    assert miss["hash"] == done["hash"]
    names = [Path(f).name for f in files(writable)]
    assert "__grp__add_kernel.json" in names and "add_kernel.cubin" in names  # compiled as without it


@needs_cc
def test_a_record_whose_source_changed_is_stale_and_not_built(recorded, tmp_path):
    tmp, toy, rec, done = recorded
    patched = tmp_path / "patched"
    patched.mkdir()
    (patched / "toykern.py").write_text(TOY.replace("mask=mask), mask=mask)", "mask=mask) + 1, mask=mask)"))
    stub = kernels.libcuda_stub(dict(os.environ), tmp_path / "stub", always=True)
    out = tmp_path / "out"
    result = triton_kernels.build(sys.executable, out, "9.0", triton_kernels.read_records([rec]),
                                  child_env(tmp_path, patched), stub)
    assert result["built"] == [] and result["failed"] == []
    [stale] = result["stale"]
    assert stale["hash"] == done["hash"] and stale["kernel"] == "toykern.add_kernel"
    assert "source differs" in stale["error"]
    built_files = files(out / "triton")
    assert any("cuda_utils" in f for f in built_files)  # the build ran
    assert not [f for f in built_files if "add_kernel" in f]


def test_a_record_for_another_arch_is_not_built(recorded, tmp_path):
    tmp, toy, rec, done = recorded
    result = triton_kernels.build(sys.executable, tmp_path / "out", "10.0", triton_kernels.read_records([rec]),
                                  child_env(tmp_path, toy), tmp_path)
    assert result == {"built": [], "carried": [], "stale": [], "failed": []} and not (tmp_path / "out").exists()


def test_provide_names_the_layer_when_there_are_triton_kernels_or_a_recording(tmp_path):
    root = tmp_path / "prebuilt"
    root.mkdir()
    assert "TRITON_CACHE_MANAGER" not in kernels.provide({"DFLASH_PREBUILT_KERNELS": str(root)})
    (root / "triton").mkdir()
    env = kernels.provide({"DFLASH_PREBUILT_KERNELS": str(root)})
    assert env["TRITON_CACHE_MANAGER"] == triton_kernels.MANAGER
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(kernels.HOOK_DIR)  # where Triton imports it from
    mine = kernels.provide({"DFLASH_PREBUILT_KERNELS": str(root), "TRITON_CACHE_MANAGER": "my:Manager"})
    assert mine["TRITON_CACHE_MANAGER"] == "my:Manager"
    recording = kernels.provide({"DFLASH_TRITON_RECORD": str(tmp_path / "rec.jsonl")})
    assert recording["TRITON_CACHE_MANAGER"] == triton_kernels.MANAGER
    assert recording["PYTHONPATH"].split(os.pathsep) == [str(kernels.HOOK_DIR)]
    assert "TRITON_CACHE_MANAGER" not in kernels.provide({})
    with pytest.raises(DflashError) as e:
        kernels.provide({"DFLASH_PREBUILT_KERNELS": str(root), "TRITON_CACHE_DIR": str(root / "triton")})
    assert e.value.exit_code == CONFIG and "TRITON_CACHE_DIR" in str(e.value)


def test_the_smokes_recording_is_shipped_for_sm90_only():
    [path] = triton_kernels.smoke_records("9.0")
    assert path.name == "triton-smoke-sm90.jsonl" and path.is_file()
    records = triton_kernels.read_records([path])
    assert len(records) == 33 and len({r["hash"] for r in records}) == 33
    assert all(r["target"] == {"arch": 90, "backend": "cuda", "warp_size": 32} for r in records)
    assert all(r["module"].startswith("sglang.") for r in records)
    assert triton_kernels.smoke_records("10.0") == []


def test_coverage_counts_the_triton_kernels(tmp_path):
    calls = kernels.calls_for(kernels.SMOKE_TARGET)
    index = {"format": 1, "built": {"9.0": calls}, "archs": ["9.0"]}
    (tmp_path / kernels.INDEX).write_text(json.dumps(index))
    ok, text = kernels.coverage(tmp_path, "9.0", {"smoke": kernels.SMOKE_TARGET})
    assert ok and "no Triton kernels (they compile at the first start)" in text
    (tmp_path / kernels.INDEX).write_text(json.dumps(dict(index, triton={"9.0": ["a" * 64, "b" * 64]})))
    ok, text = kernels.coverage(tmp_path, "9.0", {"smoke": kernels.SMOKE_TARGET})
    assert ok and "2 Triton kernel(s)" in text


@needs_cc
def test_kernels_build_notes_the_triton_kernels_in_the_index_and_leaves_stale_ones_out(recorded, tmp_path, capsys):
    tmp, toy, rec, done = recorded
    stale = tmp_path / "stale.jsonl"
    line = json.loads(rec.read_text().splitlines()[0])
    stale.write_text(json.dumps({**line, "fn_key": "0" * 64, "hash": "f" * 64}) + "\n")
    out = tmp_path / "prebuilt"
    out.mkdir()
    kernels.build_triton(sys.executable, out, ["sm90", "sm100"], [str(rec), str(stale)], False, child_env(tmp, toy))
    index = kernels.read_index(out)
    assert index["triton"]["9.0"] == [done["hash"]]  # the stale one left out
    [carried] = index["triton"]["10.0"]  # the sm90 recording carried to sm100, the stale one left out there too
    assert carried != done["hash"] and index["triton_carried"]["10.0"] == {"from": ["9.0"], "kernels": [carried],
                                                                          "left_out": []}
    err = capsys.readouterr().err
    assert "9.0: 1 recorded Triton kernel(s) left out, stale (first toykern.add_kernel: its source differs" in err
    assert "10.0: 1 recorded Triton kernel(s) left out, stale" in err
    assert "9.0: Triton 1/2 kernels" in err and "10.0: Triton 1/2 kernels" in err
    assert "(1 carried over from the 9.0 recording)" in err
    assert not [p for p in (out / triton_kernels.SUBDIR).rglob("__grp__*") if "f" * 8 in str(p)]


@needs_cc
@pytest.mark.parametrize("arch", [100, 120])
def test_an_sm90_recording_carried_to_blackwell_is_found_under_the_key_triton_computes_there(recorded, tmp_path, arch):
    """The toy recorded on "an H200", built for sm100 / sm120, and then the first call on such a GPU
    (the same compile for that target, as the runtime does it): no compile, nothing written."""
    tmp, toy, rec, done = recorded
    there = compile_toy(child_env(tmp_path, toy, TRITON_CACHE_DIR=str(tmp_path / "truth"), TOY_ARCH=str(arch)))
    assert there["hash"] != done["hash"]  # another target, another key
    out = tmp_path / "prebuilt"
    out.mkdir()
    kernels.build_triton(sys.executable, out, [f"sm{arch}"], [str(rec)], False, child_env(tmp, toy))
    index = kernels.read_index(out)
    version = f"{arch // 10}.{arch % 10}"
    assert index["triton"] == {version: [there["hash"]]}  # the key Triton computes on that GPU
    assert index["triton_carried"][version]["kernels"] == [there["hash"]]
    [cubin] = (out / "triton").rglob("add_kernel.cubin")
    assert cubin.stat().st_size > 0
    writable = tmp_path / "w"
    hit = compile_toy(with_hook(child_env(tmp_path, toy, TRITON_CACHE_DIR=str(writable), TOY_ARCH=str(arch),
                                          DFLASH_PREBUILT_KERNELS=str(out))))
    assert hit["hash"] == there["hash"] and files(writable) == []  # found, nothing compiled


def test_the_smokes_recording_carries_to_sm100_and_sm120_except_its_gpu_bound_kernels():
    records = triton_kernels.read_records(triton_kernels.shipped_records())
    assert len(records) == 33
    for version, cap in (("10.0", 100), ("12.0", 120)):
        carried, left_out = triton_kernels.carry(records, version)
        assert len(carried) == 28 and len(left_out) == 5
        assert sorted({x["kernel"] for x in left_out}) == [
            "sglang.srt.constrained.triton_ops.bitmask_ops.apply_token_bitmask_inplace_kernel",
            "sglang.srt.layers.attention.triton_ops.extend_attention._fwd_kernel"]
        assert all(x["from"] == 90 and x["why"] for x in left_out)
        by_hash = {r["hash"]: r for r in records}
        for c in carried:
            source = by_hash[c["carried_from"]["hash"]]
            assert c["target"] == {**source["target"], "arch": cap} and c["hash"] is None
            assert {k: v for k, v in c.items() if k not in ("target", "hash", "carried_from")} == \
                {k: v for k, v in source.items() if k not in ("target", "hash")}  # the same specialisation
    assert triton_kernels.carry(records, "9.0") == ([], [])  # an arch's own records are built as recorded


def test_coverage_says_which_triton_kernels_were_carried_and_which_were_left_out(tmp_path):
    calls = kernels.calls_for(kernels.SMOKE_TARGET)
    left = [{"kernel": "m.k", "from": 90, "why": "w"}, {"kernel": "m.k", "from": 90, "why": "w"},
            {"kernel": "n.bitmask", "from": 90, "why": "v"}]
    index = {"format": 1, "built": {"12.0": calls}, "archs": ["12.0"], "triton": {"12.0": ["a" * 64, "b" * 64]},
             "triton_carried": {"12.0": {"from": ["9.0"], "kernels": ["a" * 64, "b" * 64], "left_out": left}}}
    (tmp_path / kernels.INDEX).write_text(json.dumps(index))
    ok, text = kernels.coverage(tmp_path, "12.0", {"smoke": kernels.SMOKE_TARGET})
    assert ok and text.endswith("2 Triton kernel(s) (2 carried over from the 9.0 recording; 3 left out, their "
                                "specialisation depends on the GPU (bitmask, k): they compile at the first start)")
