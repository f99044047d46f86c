#!/usr/bin/env bash
# Busy GPU on the lent H200 (issue 15, item 8): NVML's answers recorded idle and busy, doctor's
# per-GPU view, and serve's preflight refusing a GPU that another process holds, in seconds.
#   1. doctor --record-nvml: idle GPU                          -> nvml-idle.json, doctor-idle.txt
#   2. a torch process allocates 120 GiB and sleeps (the holder)
#   3. doctor --record-nvml: the holder with pid, name, memory  -> nvml-busy.json, doctor-busy.txt
#   4. serve, memFractionStatic 0.5: must exit 87 in seconds, naming the holder -> serve-busy.txt
#   5. holder stopped; serve again: preflight passes, the launcher (/bin/false, so no model loads)
#      runs and exits -> serve 90                              -> serve-free.txt
# No model loads, nothing downloaded; about 40-60 s. Summary in gpu-busy-summary.txt.
# Device command (carry .gpu):  bash benchmarks/gpu/gpu_busy.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-busy-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python:$PYTHONPATH
summary=$OUT/gpu-busy-summary.txt; : >"$summary"
say() { echo "$*" | tee -a "$summary"; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }
work=$(mktemp -d)

python3 - "$work" <<'PY'
import json, sys
from pathlib import Path
from dflashctl.smoke import synthetic
work = Path(sys.argv[1])
target, draft = synthetic.write_pair(work / "models")
settings = {"name": "busy", "model": str(target), "draftModel": str(draft), "port": 31000, "gpus": [0],
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
            "attentionBackend": "triton", "samplingBackend": "pytorch", "loadFormat": "dummy",
            "draftLoadFormat": "dummy", "skipTokenizerInit": True, "memFractionStatic": 0.5,
            "cudaGraphMaxBs": 8, "startTimeoutSec": 60, "cacheDir": str(work / "cache")}
(work / "busy.json").write_text(json.dumps(settings, indent=2))
PY

# 1. idle
t0=$(ms)
python3 -m dflashctl doctor --record-nvml "$OUT/nvml-idle.json" >"$OUT/doctor-idle.txt" 2>&1
say "doctor (idle): exit $? in $(( $(ms) - t0 )) ms; $(grep -E '^(ok|warn|fail) +gpus ' "$OUT/doctor-idle.txt")"

# 2. the holder: 120 GiB through torch's allocator, then sleep
python3 - >"$work/holder.log" 2>&1 <<'PY' &
import time, torch
x = torch.empty(120 * 2**30, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(300)
PY
holder=$!
for _ in $(seq 1 120); do grep -q holding "$work/holder.log" && break; sleep 0.5; done
say "holder pid $holder: $(cat "$work/holder.log" | tail -n 1)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$summary" 2>&1

# 3. busy, as doctor sees it
t0=$(ms)
python3 -m dflashctl doctor --record-nvml "$OUT/nvml-busy.json" >"$OUT/doctor-busy.txt" 2>&1
say "doctor (busy): exit $? in $(( $(ms) - t0 )) ms; $(grep -E '^(ok|warn|fail) +gpus ' "$OUT/doctor-busy.txt")"

# 4. serve refuses
t0=$(ms)
python3 -m dflashctl serve --config "$work/busy.json" --launcher /bin/false --log-file "$work/sglang.log" \
  >"$OUT/serve-busy.txt" 2>&1
rc=$?
say "serve (busy): exit $rc after $(( $(ms) - t0 )) ms (want 87, naming pid $holder)"
grep -E "preflight|GPU 0" "$OUT/serve-busy.txt" | tee -a "$summary"

# 5. holder gone: the check passes and serve goes on to start SGLang (/bin/false here)
kill "$holder"; wait "$holder" 2>/dev/null
sleep 1
t0=$(ms)
python3 -m dflashctl serve --config "$work/busy.json" --launcher /bin/false --log-file "$work/sglang.log" \
  >"$OUT/serve-free.txt" 2>&1
rc=$?
say "serve (free): exit $rc after $(( $(ms) - t0 )) ms (want 90: preflight passed, the stand-in launcher exited)"
grep -E "gpu-memory|preflight" "$OUT/serve-free.txt" | tee -a "$summary"
rm -rf "$work"
