"""A stand-in for the stack's interpreter in preflight tests: each probe (`python -c SOURCE PROBE
ARG`) gets what the H200's probes answered (h200-probes.json, from docs/gpu/fingerprint-good.json),
so preflight passes without a GPU. Probes it has no answer for run for real, `gpus` among them
(NVML at the path given; tests point it at tests/data/gpus/fake_nvml.c built as libnvidia-ml.so.1).

RECORDED_PROBES_CHANGED=FILE changes answers for one test: {key: fields laid over the recorded answer}, which may hold
"wait_for": PATH (answer once that file exists, and holds "containing": TEXT if given, as a probe slower
than SGLang's start would; after 30 s a failure saying it never came) and "delay_s": seconds to wait
after that."""

import json
import os
import sys
import time
from pathlib import Path

source, probe = sys.argv[2], sys.argv[3]
arg = sys.argv[4] if len(sys.argv) > 4 else ""
key = {"native": {"libcuda.so.1": "libcuda", "libnuma.so.1": "libnuma"}.get(arg),
       "grammar": f"grammar:{arg}"}.get(probe, probe)
answers = json.loads(Path(__file__).with_name("h200-probes.json").read_text())
changed = os.environ.get("RECORDED_PROBES_CHANGED")
for k, v in (json.loads(Path(changed).read_text()) if changed else {}).items():
    answers[k] = {**answers.get(k, {}), **v}
answer = answers.get(key, {})
def came(path: str, text: str | None) -> bool:
    try:
        return text in Path(path).read_text(errors="replace") if text else os.path.exists(path)
    except OSError:
        return False


if "wait_for" in answer:
    for _ in range(300):
        if came(answer["wait_for"], answer.get("containing")):
            break
        time.sleep(0.1)
    else:
        answer = {"ok": False, "facts": {}, "error": f"{answer['wait_for']} never came (30 s)"}
time.sleep(answer.get("delay_s", 0))
if key not in answers:
    os.execv(sys.executable, [sys.executable, "-c", source, probe, arg])
print(json.dumps({k: v for k, v in answer.items() if k not in ("wait_for", "containing", "delay_s")}))
