"""`dflashctl smoke` run against the stand-in SGLang (tests/data/smoke/fake_sglang): `smoke` runs
the real command, `env_for` is its environment, `prompts` what it sends, `fake_without_ddtree` the
stand-in as SGLang 0.5.11 was released, and the `running` fixture stand-in services for --url mode
(registered in conftest.py)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashctl.smoke import loadgen, ports

DATA = Path(__file__).resolve().parent / "data" / "smoke"
FAKE = DATA / "fake_sglang"
SGLANG_FACTS = Path(__file__).resolve().parent / "data" / "sglang"  # strict_args.py for the stand-in
GRAMMAR = DATA / "h200-grammar" / "baseline.json"  # SGLang's answers to the grammar phase on the H200
PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
SETTINGS = {"requests": 4, "sequential_requests": 2, "max_new_tokens": 16, "input_len": 8, "seed": 0}
LOAD_ARGS = ["--requests", str(SETTINGS["requests"]),
             "--sequential-requests", str(SETTINGS["sequential_requests"]),
             "--max-new-tokens", str(SETTINGS["max_new_tokens"]),
             "--input-len", str(SETTINGS["input_len"]), "--seed", str(SETTINGS["seed"])]


def prompts(count=SETTINGS["requests"], length=SETTINGS["input_len"], seed=SETTINGS["seed"]) -> list[list[int]]:
    """The prompts smoke sends (request i is prompts()[i]), to aim a fault at one of them."""
    return loadgen.token_prompts(count, length, seed)


IDLE_H200 = Path(__file__).resolve().parent / "data" / "gpus" / "h200-idle.json"


def env_for(fake: Path = FAKE, grammar: Path = GRAMMAR, faults=None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_PREBUILT_KERNELS"}  # the dev shell sets it
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), str(fake), str(SGLANG_FACTS)])
    env["FAKE_SGLANG_GRAMMAR"] = str(grammar)
    env["DFLASHCTL_NVML_REPLAY"] = str(IDLE_H200)  # the launch plan reads the GPU's free memory
    if faults:
        env["FAKE_SGLANG_FAULTS"] = json.dumps(faults)
    env.update(extra)
    return env


def smoke(tmp_path, *args, fake=FAKE, grammar=GRAMMAR, faults=None, timeout=60, **extra):
    """The real command against the stand-in; the random pair unless `args` name a --pair (the
    oracle pair's tests are in test_smoke_oracle.py). `faults`: what the stand-in is to break."""
    extra.setdefault("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm-ffi"))  # the stand-in's JIT "compiles" there
    pair = [] if "--pair" in args or "--model" in args or "--url" in args else ["--pair", "random"]
    cmd = [sys.executable, "-m", "dflashctl", "smoke", *LOAD_ARGS, "--triton-cache", str(tmp_path / "triton"),
           *pair, *args]
    return subprocess.run(cmd, env=env_for(fake, grammar, faults, **extra), capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


def fake_without_ddtree(tmp_path) -> Path:
    fake = tmp_path / "fake"
    shutil.copytree(FAKE, fake)
    args = fake / "sglang" / "srt" / "server_args.py"
    args.write_text(args.read_text().replace('"DDTREE", ', ""))
    return fake


def start_fake(tmp_path, run: str, args=("--skip-tokenizer-init",), api_key=None, **extra):
    """A stand-in service of one model ("m": random weights); `args`: more SGLang flags (default:
    token ids in and out)."""
    extra.setdefault("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm-ffi"))
    port = _free_port()
    argv = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--model-path", "m", *args]
    if run != "baseline":
        argv += ["--speculative-algorithm", run, "--speculative-draft-model-path", "d"]
    if api_key:
        argv += ["--api-key", api_key]
    proc = subprocess.Popen(argv, env=env_for(**extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            loadgen.get_json(loadgen.Endpoint(url, api_key), "/model_info", 1)
            break
        except Exception:
            time.sleep(0.05)
    return proc, url


def _free_port() -> int:
    return ports.free_port()


@pytest.fixture
def running(tmp_path):
    procs = []

    def start(run, args=("--skip-tokenizer-init",), **extra):
        proc, url = start_fake(tmp_path, run, args, **extra)
        procs.append(proc)
        return url
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
