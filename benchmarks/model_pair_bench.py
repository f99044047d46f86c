"""How fast a drafter that does not fit its target is refused: `validate --models` and serve's preflight.

    .venv/bin/python benchmarks/model_pair_bench.py [--runs 10]

The pair is the published shapes of tests/data/models (Qwen3-8B with the Llama-3.1-8B-Instruct
DFlash drafter: same width and heads, another vocabulary and depth, which SGLang 0.5.11 would load
and serve), laid out as the hub client lays out a cache (the weights are placeholders: nothing
reads them). Three cases, real processes: `dflashctl validate --models` (what the NixOS build
runs), the check itself in this process (service/model_check.py), and `dflashctl serve` from start
to exit 79 with the stack's interpreter standing in as the H200's probes answered
(tests/data/service/recorded_python.py) and NVML replayed from the H200. Prints a Markdown table
for docs/benchmarks.md. What SGLang does with such a pair on a GPU: benchmarks/gpu/model_pair.sh.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests"))

from model_pair_files import LLAMA_DRAFT, cached_pair, hub_settings  # noqa: E402

from dflashctl.service import config, model_check  # noqa: E402

RECORDED_PYTHON = REPO / "tests" / "data" / "service" / "recorded_python.py"
NVML_IDLE = REPO / "tests" / "data" / "gpus" / "h200-idle.json"
ENV = dict(os.environ, PYTHONPATH=str(REPO / "python"), DFLASHCTL_NVML_REPLAY=str(NVML_IDLE),
           HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there: a request would fail, not wait


def timed(argv: list[str]) -> tuple[float, int, str]:
    t0 = time.monotonic()
    run = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    return time.monotonic() - t0, run.returncode, run.stderr


def row(name: str, samples: list[float], code) -> str:
    return (f"| {name} | {statistics.median(samples) * 1000:.0f} ms | {max(samples) * 1000:.0f} ms | "
            f"{code} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cached_pair(tmp / "hf", draft=LLAMA_DRAFT)
        settings = hub_settings(tmp / "hf", memFractionStatic=0.5, gpus=[0], port=31999)
        f = tmp / "pair.json"
        f.write_text(json.dumps(settings))
        python = tmp / "python"
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{RECORDED_PYTHON}" "$@"\n')
        python.chmod(0o755)
        cfg = config.from_dict(settings)
        env = {"HF_HOME": str(tmp / "hf")}
        validate, inproc, serve = [], [], []
        codes = {}
        for _ in range(a.runs):
            s, codes["validate"], err = timed([sys.executable, "-m", "dflashctl", "validate", str(f), "--models"])
            assert "vocab_size" in err, err
            validate.append(s)
            t0 = time.monotonic()
            found = model_check.check(cfg, env, str(f)).checks
            inproc.append(time.monotonic() - t0)
            codes["check"] = ", ".join(sorted({c.name for c in found if c.status == "fail"}))
            s, codes["serve"], err = timed([sys.executable, "-m", "dflashctl", "serve", "--config", str(f),
                                            "--python", str(python), "--launcher", "/bin/false",
                                            "--log-file", str(tmp / "log")])
            assert "SGLang was not started" in err, err
            serve.append(s)
    print(f"{a.runs} runs on {platform.node()} ({os.cpu_count()} CPUs)\n")
    print("| case | median | max | exit code |\n|---|---|---|---|")
    print(row("`dflashctl validate --models` (process start to exit)", validate, codes["validate"]))
    print(row(f"the check in-process (`model_check.check`: {codes['check']})", inproc, "-"))
    print(row("`dflashctl serve` start -> exit, preflight probes and the model pair", serve, codes["serve"]))


if __name__ == "__main__":
    main()
