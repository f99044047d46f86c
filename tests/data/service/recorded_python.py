"""A stand-in for the stack's interpreter in preflight tests: each probe (`python -c SOURCE PROBE
ARG`) gets what the H200's probes answered (h200-probes.json, from docs/gpu/fingerprint-good.json),
so preflight passes without a GPU. Probes it has no answer for run for real, `gpus` among them
(NVML at the path given; tests point it at tests/data/gpus/fake_nvml.c built as libnvidia-ml.so.1)."""

import json
import os
import sys
from pathlib import Path

source, probe = sys.argv[2], sys.argv[3]
arg = sys.argv[4] if len(sys.argv) > 4 else ""
key = {"native": {"libcuda.so.1": "libcuda", "libnuma.so.1": "libnuma"}.get(arg),
       "grammar": f"grammar:{arg}"}.get(probe, probe)
answers = json.loads(Path(__file__).with_name("h200-probes.json").read_text())
if key not in answers:
    os.execv(sys.executable, [sys.executable, "-c", source, probe, arg])
print(json.dumps(answers[key]))
