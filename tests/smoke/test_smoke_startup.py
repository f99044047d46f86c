"""Where start-up time goes: the phase parser over SGLang log text, the JIT-cache reader, and
smoke keeping every server's log. Logs: tests/data/smoke/logs (README there says which are real)."""

import datetime as dt
import json
import os
import re
from pathlib import Path

import pytest
from smoke_runner import DATA, smoke

from dflashctl.smoke import startup

LOGS = DATA / "logs"
DOCS_GPU = Path(__file__).resolve().parent.parent.parent / "docs" / "gpu"


@pytest.mark.parametrize("name", ["baseline-fresh-h200", "DFLASH-fresh-h200", "DFLASH-fresh-h200-constructed"])
def test_phases_of_a_fresh_start_golden(name):
    """The real logs are SGLang's own from the H200 smoke of docs/gpu/smoke-final-h200.json; their
    expected phases are what smoke reported there (the constructed one's were worked out by hand)."""
    expected = json.loads((LOGS / f"{name}.expected.json").read_text())
    launched = dt.datetime.fromisoformat(expected["launched"])
    got = startup.phases((LOGS / f"{name}.log").read_text(errors="replace"), launched, expected["ready_s"])
    assert got.pop("faststart") is None  # recorded before the fast start: none of its lines
    assert got == expected["phases"]
    assert round(sum(got["seconds"].values()), 3) == expected["ready_s"]  # the phases split the start


def test_the_real_dflash_log_has_two_models_and_the_h200_figures():
    """DFLASH loads and captures target and drafter; the figures are the ones docs/benchmarks.md quotes."""
    expected = json.loads((LOGS / "DFLASH-fresh-h200.expected.json").read_text())["phases"]
    assert (expected["weight_loads"], expected["graph_captures"], expected["missing_lines"]) == (2, 2, [])
    recorded = json.loads((DOCS_GPU / "smoke-final-h200.json").read_text())
    assert {r["name"]: r["startup"] for r in recorded["runs"]} == {
        name: json.loads((LOGS / f"{name}-fresh-h200.expected.json").read_text())["phases"]
        for name in ("baseline", "DFLASH")}


def test_stamps_without_milliseconds_and_no_cuda_graphs():
    """SGLang without SGLANG_LOG_MS stamps whole seconds; --no-cuda-graph logs no capture."""
    log = "\n".join([
        "[2026-11-30 10:00:21] server_args=ServerArgs(model_path='m')",
        "[2026-11-30 10:00:30 TP0] Init torch distributed begin.",
        "[2026-11-30 10:00:31 TP0] Load weight begin. avail mem=139.05 GB",
        "[2026-11-30 10:00:33 TP0] Load weight end. elapsed=1.90 s, type=Qwen3ForCausalLM",
        "[2026-11-30 10:00:40] The server is fired up and ready to roll!",
    ])
    got = startup.phases(log, dt.datetime(2026, 11, 30, 10, 0, 0, 500000), 41.0)
    assert got["seconds"] == {"imports": 20.5, "scheduler_start": 9.0, "model_init": 1.0, "weight_load": 2.0,
                              "memory_pool": None, "cuda_graph_capture": None, "server_warmup": 7.0,
                              "first_healthy_decode": 1.5}
    assert got["missing_lines"] == ["Capture cuda graph begin."]


def test_a_start_that_died_has_phases_up_to_its_last_line():
    log = "[2026-11-30 10:00:20.000] server_args=ServerArgs()\n[2026-11-30 10:00:31.000] Load weight begin.\n" \
          "RuntimeError: CUDA error: out of memory\n"
    got = startup.phases(log, dt.datetime(2026, 11, 30, 10, 0, 0), None)
    assert got["seconds"]["imports"] == 20.0 and got["seconds"]["scheduler_start"] == 11.0
    assert got["seconds"]["weight_load"] == 0.0 and got["seconds"]["first_healthy_decode"] is None
    assert "Init torch distributed begin." in got["missing_lines"]


def touch(path, t, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (t, t))


def test_jit_caches_say_what_compiled_and_when(tmp_path):
    since = 1_800_000_000.0
    tvm = tmp_path / "tvm-ffi"
    touch(tvm / "sgl_kernel_jit_qknorm_64_true_bf16_t_ab12" / "build.ninja", since + 10)
    touch(tvm / "sgl_kernel_jit_qknorm_64_true_bf16_t_ab12" / "sgl_kernel_jit_qknorm_64_true_bf16_t.so", since + 22)
    touch(tvm / "sgl_kernel_jit_kvcache_1024_true_cd34" / "build.ninja", since + 15)
    touch(tvm / "sgl_kernel_jit_kvcache_1024_true_cd34" / "sgl_kernel_jit_kvcache_1024_true.so", since + 30)
    touch(tvm / "sgl_kernel_jit_rope_old" / "build.ninja", since - 100)  # an earlier start's: a cache hit
    touch(tvm / "sgl_kernel_jit_rope_old" / "sgl_kernel_jit_rope.so", since - 90)
    touch(tvm / "sgl_kernel_jit_broken" / "build.ninja", since + 40)  # no .so: failed or unfinished
    fi = tmp_path / "home" / ".cache" / "flashinfer" / "0.6.8" / "90" / "cached_ops" / "norm"
    touch(fi / "build.ninja", since + 5)
    touch(fi / "norm.so", since + 28)
    triton = tmp_path / "triton"
    touch(triton / "K1" / "kernel.cubin", since + 31)
    touch(triton / "K2" / "kernel.cubin", since + 33.5)
    caches = startup.jit_caches({"HOME": str(tmp_path / "home"), "TVM_FFI_CACHE_DIR": str(tvm)}, str(triton))
    got = startup.compiled_since(caches, since)
    assert [m["module"] for m in got["tvm-ffi"]["modules"]] == ["sgl_kernel_jit_qknorm_64_true_bf16_t_ab12",
                                                               "sgl_kernel_jit_kvcache_1024_true_cd34"]
    assert (got["tvm-ffi"]["busy_s"], got["tvm-ffi"]["first_s"], got["tvm-ffi"]["last_s"]) == (20.0, 10.0, 30.0)
    assert got["flashinfer"]["compiled"] == 1 and got["flashinfer"]["busy_s"] == 23.0
    assert (got["triton"]["compiled"], got["triton"]["first_s"], got["triton"]["last_s"]) == (2, 31.0, 33.5)
    line = startup.lines({"runs": [], "jit_compiled": got})[0]
    assert "tvm-ffi 2 modules, compiling 20.0s between 10.0s and 30.0s" in line
    assert "triton 2 kernels, written between 31.0s and 33.5s" in line


def test_smoke_reports_phases_and_keeps_every_log(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--keep-logs", "logs", "--json", "result.json",
              FAKE_SGLANG_READY_AFTER="0.8")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    for run in result["runs"]:
        kept = tmp_path / "logs" / f"{run['name']}.log"
        assert run["log"] == str(kept) and "The server is fired up" in kept.read_text()
        start = run["startup"]
        assert start["missing_lines"] == [] and abs(start["ready_s"] - run["startup_s"]) < 0.01
        assert start["weight_loads"] == start["graph_captures"] == (1 if run["name"] == "baseline" else 2)
        assert abs(sum(start["seconds"].values()) - run["startup_s"]) < 0.01
        assert all(v is not None for v in start["seconds"].values())
    assert set(result["jit_compiled"]) == {"tvm-ffi", "flashinfer", "triton"}
    assert "start-up DFLASH: imports " in p.stdout and "JIT compiled during this smoke" in p.stdout
    # smoke sets SGLANG_LOG_MS=1 for its servers: stamps with milliseconds
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] Load weight begin",
                     (tmp_path / "logs" / "DFLASH.log").read_text(), re.M)


def test_failed_start_still_keeps_the_log(tmp_path):
    p = smoke(tmp_path, "--runs", "DFLASH", "--keep-logs", "logs", FAKE_SGLANG_DIE="start")
    assert p.returncode != 0
    assert "replayed failure" in (tmp_path / "logs" / "DFLASH.log").read_text()


def test_jit_prewarm_builds_the_kernels_before_the_servers_need_them(tmp_path):
    """The helper calls SGLang's loaders in the servers' environment: the servers' first capture
    finds every module built (the stand-in's jit_kernel compiles into TVM_FFI_CACHE_DIR)."""
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--keep-logs", "logs", "--json", "result.json",
              FAKE_SGLANG_READY_AFTER="2")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    pre = result["jit_prewarm"]
    assert pre["enabled"] and pre["ok"] and len(pre["calls"]) == 7 and result["settings"]["jit_prewarm"]
    assert result["jit_compiled"]["tvm-ffi"]["compiled"] == 7
    for run in ("baseline", "DFLASH"):
        assert "JIT at first use: built 0, found 5 in the cache" in (tmp_path / "logs" / f"{run}.log").read_text()
    assert "JIT prewarm: 7/7 kernel modules ready" in p.stdout


def test_without_prewarm_the_servers_compile_at_first_use(tmp_path):
    p = smoke(tmp_path, "--runs", "DFLASH", "--no-jit-prewarm", "--keep-logs", "logs", "--json", "result.json")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["jit_prewarm"] == {"enabled": False, "reason": "--no-jit-prewarm"}
    assert result["settings"]["jit_prewarm"] is False
    assert "JIT at first use: built 5, found 0" in (tmp_path / "logs" / "DFLASH.log").read_text()
    assert result["jit_compiled"]["tvm-ffi"]["compiled"] == 5
    assert "JIT prewarm: off (--no-jit-prewarm)" in p.stdout


@pytest.mark.parametrize("built_for,prewarmed", [("9.0", False), ("10.0", True)])
def test_no_prewarm_where_the_prebuilt_kernels_cover_this_gpu(tmp_path, built_for, prewarmed):
    """The replayed NVML (tests/data/gpus/h200-idle.json, recorded on the H200) says compute
    capability 9.0: kernels prebuilt for it leave the prewarm nothing to compile, and its imports
    would only slow the servers'; built for another arch only, the prewarm runs."""
    from dflashctl.host import kernels
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    (prebuilt / kernels.INDEX).write_text(json.dumps(
        {"format": 1, "archs": [built_for], "built": {built_for: kernels.calls_for(kernels.SMOKE_TARGET)}}))
    p = smoke(tmp_path, "--runs", "DFLASH", "--json", "result.json", DFLASH_PREBUILT_KERNELS=str(prebuilt))
    assert p.returncode == 0, p.stderr
    pre = json.loads((tmp_path / "result.json").read_text())["jit_prewarm"]
    if prewarmed:
        assert pre["enabled"] and len(pre["calls"]) == 7
        assert "JIT prewarm: 7/7 kernel modules ready" in p.stdout
    else:
        assert pre == {"enabled": False, "covered": True, "reason": "prebuilt kernels: compute capability 9.0, "
                       "1 model shape(s): every module prebuilt, no Triton kernels (they compile at the first start)"}
        assert "JIT prewarm: not needed, prebuilt kernels: compute capability 9.0" in p.stdout


def test_prewarm_calls_follow_the_model_shapes():
    from dflashctl.smoke import jit_prewarm, synthetic
    calls = jit_prewarm.calls_for(synthetic.target_config(synthetic.PairShape()))
    assert ["sglang.jit_kernel.norm", "can_use_fused_inplace_qknorm", [64, "torch.bfloat16"]] in calls
    assert ["sglang.jit_kernel.kvcache", "can_use_store_cache", [8 * 64 * 2]] in calls
    assert ["sglang.jit_kernel.resolve_future_token_ids", "_jit_resolve_future_token_ids_module",
            ["torch.int64"]] in calls  # built last on the H200 when the prewarm lacked it
    qwen3_8b = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "torch_dtype": "bfloat16"}
    assert ["sglang.jit_kernel.rope", "_jit_fused_rope_module", [True, 128, "torch.bfloat16"]] in \
        jit_prewarm.calls_for(qwen3_8b)


def test_a_stack_without_byte_code_is_named_under_the_start_up_lines():
    """The identity's fingerprint holds doctor's bytecode check; a warning explains slow imports."""
    warn = {"name": "bytecode", "status": "warn", "fix": "python3 -m compileall -q -j0 /site/torch",
            "summary": "modules without current byte code: torch 0/2141: every start compiles them"}
    result = {"runs": [], "identity": {"fingerprint": {"checks": [warn]}}}
    assert startup.lines(result) == ["Python byte code: modules without current byte code: torch 0/2141: every "
                                     "start compiles them; fix: python3 -m compileall -q -j0 /site/torch"]
    result["identity"]["fingerprint"]["checks"] = [{**warn, "status": "ok"}]
    assert startup.lines(result) == []
    assert startup.lines({"runs": [], "identity": {"unknown": {}}}) == []  # --url: no fingerprint
