"""Prebuilt JIT kernels: tvm-ffi's own key, a build on this CPU machine, a read-only directory loaded
as it is, misses that compile into the writable cache, and a cache that cannot be written failing
at once instead of hanging.

These use the real tvm-ffi wheel (apache-tvm-ffi, as locked) and a stand-in for SGLang's loaders
that calls `tvm_ffi.cpp.load_inline` the way SGLang's `load_jit` does; the CUDA build needs nvcc.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import kernels
from dflashctl.host.kernel_hook import dflash_kernel_hook as hook

extension = pytest.importorskip("tvm_ffi.cpp.extension", reason="the tvm-ffi wheel is not installed")
needs_cxx = pytest.mark.skipif(not (shutil.which("c++") and shutil.which("ninja")), reason="no c++ or ninja")
CUDA = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")  # a toolkit with lib64/libcudart.so
needs_nvcc = pytest.mark.skipif(not os.access(CUDA / "bin" / "nvcc", os.X_OK), reason=f"no {CUDA}/bin/nvcc")

STANDIN = '''
"""Stand-in for sglang.jit_kernel: each loader builds one module through tvm-ffi's load_inline."""
import os
from tvm_ffi.cpp import load_inline  # noqa: F401 (SGLang imports it inside load_jit; so do we)
import tvm_ffi.cpp

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, "include")

def build_cpu(n):
    return tvm_ffi.cpp.load_inline(
        f"standin_add_{n}",
        cpp_sources=[f'#include "{INCLUDE}/add.h"', f"int64_t add_n(int64_t x) {{ return dflash_add(x, {n}); }}"],
        functions=["add_n"], extra_cflags=["-std=c++17", "-O2"], extra_include_paths=[INCLUDE])

def build_cuda(n):
    return tvm_ffi.cpp.load_inline(
        f"standin_cuda_{n}",
        cpp_sources="void noop(int64_t x);",
        cuda_sources=f"__global__ void k(int* p) {{ *p = {n}; }}\\nvoid noop(int64_t x) {{ (void)x; }}",
        functions=["noop"], extra_cuda_cflags=["-DSGL_CUDA_ARCH=900", "-O2"])
'''


@pytest.mark.parametrize("inputs", [
    (None, None, None, None, {}, [], [], [], []),
    ("int f();", "__global__ void k();", ["/b.cu", "/a.cu"], None, {"f": "doc"}, ["-O3"], ["-DSGL_CUDA_ARCH=900"],
     ["-lcuda"], ["/inc"]),
    ("", "", None, ["/z.cu"], ["f", "g"], ["-std=c++20"], [], [], [], {"cubin": b"\x00\x7f"}),
    ("ünïcode \"quoted\"\n\t", None, [], [], {"b": "", "a": "x\ny"}, [], [], [], ["/é"]),
])
def test_key_equals_tvm_ffis_own(inputs):
    assert hook.digest(*inputs) == extension._hash_sources(*inputs)


def test_build_directory_is_the_one_tvm_ffis_build_inline_picks(tmp_path, monkeypatch):
    """tvm-ffi's own build_inline, stopped before it compiles: the directory it chose."""
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(extension, "_build_impl", lambda **kw: kw["build_directory"])
    for functions in (None, "f", ["f", "g"], {"f": "say \"hi\"\n\t\\"}):
        for cpp, cuda in (("int f();", None), (None, "__global__ void k();"), (["a", "b"], "c")):
            kw = dict(cpp_sources=cpp, cuda_sources=cuda, functions=functions, extra_cflags=["-O2"],
                      extra_cuda_cflags=["-DSGL_CUDA_ARCH=900"], extra_include_paths=["/i"])
            chosen = Path(extension.build_inline("m", **kw))
            assert hook.inline_dir_name("m", **kw) == chosen.name, (functions, cpp, cuda)


@pytest.fixture
def standin(tmp_path):
    return _standin(tmp_path)


def _standin(tmp_path):
    src = tmp_path / "standin"
    (src / "include").mkdir(parents=True)
    (src / "include" / "add.h").write_text("#include <cstdint>\ninline int64_t dflash_add(int64_t a, int64_t b) "
                                           "{ return a + b; }\n")
    (src / "standin_jit.py").write_text(STANDIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TVM_FFI", "DFLASH_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(src)] + sys.path), HOME=str(tmp_path / "home"),
               TVM_FFI_CUDA_ARCH_LIST="9.0")  # what SGLang sets around each build on an H200
    env["CUDA_HOME"] = str(CUDA)  # loading a CUDA module needs libcudart (in SGLang, torch has loaded it)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(CUDA / "lib64"), env.get("LD_LIBRARY_PATH")) if p)
    return src, env


def run_child(env: dict, code: str, prebuilt: Path | None, cache: Path) -> subprocess.CompletedProcess:
    env = dict(env, TVM_FFI_CACHE_DIR=str(cache))
    if prebuilt is not None:
        env = kernels.provide(dict(env, DFLASH_PREBUILT_KERNELS=str(prebuilt)))
    # a hang here would be the bug this guards against: the timeout turns it into a failure
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def snapshot(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


@needs_cxx
def test_built_modules_load_from_a_read_only_directory_without_compiling(standin, tmp_path):
    src, env = standin
    out = tmp_path / "prebuilt"
    index = kernels.build(sys.executable, out, ["sm90"], [["standin_jit", "build_cpu", [3]]], env)
    assert index["built"] == {"9.0": [["standin_jit", "build_cpu", [3]]]} and index["archs"] == ["9.0"]
    [record] = out.glob(f"*/{hook.RECORD}")
    assert json.loads(record.read_text())["arch_list"] == "9.0"
    before = snapshot(out)

    cache = tmp_path / "cache"
    hit = run_child(env, "import standin_jit; print(standin_jit.build_cpu(3).add_n(4))", out, cache)
    assert hit.returncode == 0, hit.stderr
    assert hit.stdout.strip() == "7"
    assert f"loaded standin_add_3 from {record.parent}" in hit.stderr
    assert not cache.exists() or not any(cache.iterdir())  # nothing compiled
    assert snapshot(out) == before  # nothing written into the prebuilt directory

    miss = run_child(env, "import standin_jit; print(standin_jit.build_cpu(5).add_n(4))", out, cache)
    assert miss.returncode == 0, miss.stderr
    assert miss.stdout.strip() == "9" and "not prebuilt: standin_add_5_" in miss.stderr
    assert [p.name.split("_")[:3] for p in cache.iterdir()] == [["standin", "add", "5"]]  # the normal JIT


@needs_cxx
def test_a_changed_header_or_another_arch_misses_instead_of_loading_a_stale_module(standin, tmp_path):
    src, env = standin
    out = tmp_path / "prebuilt"
    kernels.build(sys.executable, out, ["sm90"], [["standin_jit", "build_cpu", [3]]], env)
    code = "import standin_jit; print(standin_jit.build_cpu(3).add_n(4))"
    other_arch = run_child(dict(env, TVM_FFI_CUDA_ARCH_LIST="10.0"), code, out, tmp_path / "c1")
    assert "was built for '9.0', this build asks '10.0'" in other_arch.stderr
    assert other_arch.stdout.strip() == "7"

    # A patched SGLang at the same path: the key (paths and flags only) is unchanged, the digest is not.
    (src / "include" / "add.h").write_text("#include <cstdint>\ninline int64_t dflash_add(int64_t a, int64_t b) "
                                           "{ return a + b + 100; }\n")
    patched = run_child(env, code, out, tmp_path / "c2")
    assert patched.returncode == 0, patched.stderr
    assert "the headers differ" in patched.stderr and patched.stdout.strip() == "107"


@needs_cxx
def test_a_miss_with_an_unwritable_cache_fails_at_once_with_the_fix(standin, tmp_path):
    src, env = standin
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    p = run_child(env, "import standin_jit; standin_jit.build_cpu(6)", tmp_path / "empty", blocker / "cache")
    assert p.returncode != 0
    assert "TVM_FFI_CACHE_DIR" in p.stderr and "cannot be created" in p.stderr
    assert "dflashctl kernels build" in p.stderr


@pytest.fixture(scope="module")
def sm90_build(tmp_path_factory):
    """One CUDA module built for sm90 without a GPU: (env, prebuilt directory, its .so)."""
    root = tmp_path_factory.mktemp("sm90")
    _, env = _standin(root)
    out = root / "prebuilt"
    kernels.build(sys.executable, out, ["sm90"], [["standin_jit", "build_cuda", [1]]], env)
    [so] = out.glob("standin_cuda_1_*/standin_cuda_1.so")
    return env, out, so


@needs_cxx
@needs_nvcc
def test_cuda_modules_build_for_a_named_arch_without_a_gpu(sm90_build, tmp_path):
    env, out, _ = sm90_build
    hit = run_child(env, "import standin_jit; standin_jit.build_cuda(1)", out,
                    tmp_path / "cache")
    assert hit.returncode == 0, hit.stderr
    assert "loaded standin_cuda_1" in hit.stderr and not (tmp_path / "cache").exists()


@needs_cxx
@needs_nvcc
def test_a_module_built_for_sm90_holds_sass_for_sm90_only(sm90_build):
    if not (CUDA / "bin" / "cuobjdump").exists():  # not in every toolkit (this machine's has none)
        pytest.skip(f"no {CUDA}/bin/cuobjdump: the module's SASS architectures are not listed here")
    sass = subprocess.run([str(CUDA / "bin" / "cuobjdump"), "--list-elf", str(sm90_build[2])], capture_output=True,
                          text=True)
    assert "sm_90" in sass.stdout and "sm_100" not in sass.stdout, sass.stdout + sass.stderr


def test_the_store_is_never_the_writable_cache(tmp_path):
    with pytest.raises(DflashError) as e:
        kernels.provide({"DFLASH_PREBUILT_KERNELS": str(tmp_path), "TVM_FFI_CACHE_DIR": str(tmp_path)})
    assert e.value.exit_code == CONFIG
    env = kernels.provide({"DFLASH_PREBUILT_KERNELS": str(tmp_path), "PYTHONPATH": "/a"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(kernels.HOOK_DIR), "/a"]
    assert "PYTHONPATH" not in kernels.provide({})  # no prebuilt kernels: the child is left alone


def test_coverage_names_the_missing_arch_and_shape(tmp_path):
    calls = kernels.calls_for(kernels.SMOKE_TARGET)
    (tmp_path / kernels.INDEX).write_text(json.dumps({"format": 1, "built": {"9.0": calls}, "archs": ["9.0"]}))
    ok, text = kernels.coverage(tmp_path, "sm90", {"smoke": kernels.SMOKE_TARGET})
    assert ok, text
    ok, text = kernels.coverage(tmp_path, "12.0", {"smoke": kernels.SMOKE_TARGET})
    assert not ok and "not built for compute capability 12.0 (built: 9.0)" in text
    qwen8b = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"}
    ok, text = kernels.coverage(tmp_path, "9.0", {"Qwen3-8B": qwen8b})
    assert not ok and "Qwen3-8B: 3 of 7 modules" in text


def test_smoke_targets_are_the_smokes_own_targets():
    """The oracle pair (the default) and the random-weight pair (the grammar server, --pair random)."""
    from dflashctl.smoke import oracle, synthetic
    assert kernels.calls_for(kernels.SMOKE_TARGET) == kernels.calls_for(
        synthetic.target_config(synthetic.PairShape()))
    assert kernels.calls_for(kernels.ORACLE_TARGET) == kernels.calls_for(
        oracle.target_config(oracle.OracleShape()))
    assert set(kernels.model_configs([], True)) == set(kernels.SMOKE_TARGETS)


@pytest.mark.parametrize("arch,want", [("sm90", "9.0"), ("sm_100", "10.0"), ("sm120", "12.0"), ("8.9", "8.9")])
def test_arch_names(arch, want):
    assert kernels.arch_version(arch) == want


def test_doctor_says_whether_this_gpu_and_the_models_are_covered(tmp_path):
    calls = kernels.calls_for(kernels.SMOKE_TARGET)
    (tmp_path / kernels.INDEX).write_text(json.dumps({"format": 1, "built": {"9.0": calls}, "archs": ["9.0"]}))
    h200 = {"ok": True, "facts": {"gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}]}}
    smoke = {"smoke's synthetic target": kernels.SMOKE_TARGET}
    c = kernels.doctor_check(str(tmp_path), h200, smoke)
    assert c.status == "ok" and "every module prebuilt" in c.summary
    rtx = {"ok": True, "facts": {"gpus": [{"name": "RTX PRO 6000", "compute_capability": "12.0"}]}}
    c = kernels.doctor_check(str(tmp_path), rtx, smoke)
    assert c.status == "warn" and "not built for compute capability 12.0" in c.summary and "--arch" in c.fix
    c = kernels.doctor_check(None, h200, smoke)
    assert c.status == "warn" and "DFLASH_PREBUILT_KERNELS" in c.summary and "kernels build" in c.fix


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")
def test_the_libcuda_stub_carries_the_drivers_soname(tmp_path):
    stub = kernels.libcuda_stub({"CUDA_HOME": str(tmp_path / "no-toolkit"), "PATH": os.environ["PATH"]},
                                tmp_path / "s")
    dynamic = subprocess.run(["readelf", "-d", str(stub / "libcuda.so")], capture_output=True, text=True).stdout
    assert "[libcuda.so.1]" in dynamic
    (tmp_path / "cuda" / "lib64" / "stubs").mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")
    assert kernels.libcuda_stub({"CUDA_HOME": str(tmp_path / "cuda")}, tmp_path / "t") is None  # the toolkit's own


FAKE_NVML = '''
import os
def nvmlInit(): pass
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetHandleByUUID(u): return 0
def nvmlDeviceGetCudaComputeCapability(h):
    return tuple(int(x) for x in os.environ["FAKE_CC"].split("."))
'''


@pytest.mark.parametrize("cc,archs,used", [("9.0", ["9.0", "10.0"], True), ("12.0", ["9.0", "10.0"], False)])
def test_flashinfers_aot_directory_is_given_only_for_a_listed_gpu(tmp_path, cc, archs, used):
    """flashinfer loads <aot>/<module>/<module>.so with no arch check: the stand-in for the
    flashinfer-jit-cache wheel hands the directory out only when this GPU is in the build."""
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FAKE_NVML)
    aot = tmp_path / "prebuilt" / "flashinfer-aot"
    aot.mkdir(parents=True)
    code = ("import json, os, flashinfer_jit_cache as c\n"
            "json.dump({'archs': %r, 'flashinfer': c.__version__}, open(%r, 'w'))\n"
            "print(c.get_jit_cache_dir())" % (archs, str(aot / hook.RECORD)))
    env = dict(os.environ, FAKE_CC=cc, DFLASH_PREBUILT_KERNELS=str(tmp_path / "prebuilt"),
               PYTHONPATH=os.pathsep.join([str(kernels.HOOK_DIR), str(tmp_path / "nvml")]))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert (p.stdout.strip() == str(aot)) == used
    if not used:
        assert f"this GPU is {cc}" in p.stderr


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path):
    """nixpkgs' Python has a sitecustomize (it reads NIX_PYTHONPATH); the hook's shadows it and runs it."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import sys\nsys.dflash_test_marker = 'ran'\n")
    env = kernels.provide({**os.environ, "DFLASH_PREBUILT_KERNELS": str(tmp_path),
                           "PYTHONPATH": str(tmp_path / "site")})
    code = ("import sys, sitecustomize\n"
            "print(getattr(sys, 'dflash_test_marker', None), sitecustomize.__file__)\n"
            "print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    marker, hook_installed = p.stdout.splitlines()
    assert marker == f"ran {tmp_path / 'site' / 'sitecustomize.py'}" and hook_installed == "True"
