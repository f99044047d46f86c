#!/usr/bin/env bash
# GPU health on a real GPU (issue 31), about 90 s of device time once the payload is unpacked:
#   1. `dflashctl doctor --json` over the real NVML on a healthy GPU: each GPU's gpu-health:N check
#      with the raw figures, and --record-nvml (the snapshot the stand-in's healthy scenario mirrors,
#      now with the GPU recovery action that tests/data/gpus/h200-health.json lacks); ~6 s.
#   2. benchmarks/gpu/watch_cost.py: one real DFLASH instance of the smoke's oracle pair under
#      `dflashctl serve` (rollout.sh's settings), 8 closed-loop clients; 6 windows of 3 s, the GPU
#      watch running beside it (as serve runs it) in half of them: tokens/s with and without, the
#      ratio, the noise floor, the watch's CPU time. SGLang's start (~65 s on a fresh H200 without
#      prebuilt kernels, less with warm JIT caches) is most of it.
# Device command, from the repository root (the payload as for the other scripts: .gpu-i21 with
# payload.tar.xz carried, or /tmp/site already unpacked by an earlier script of the same call):
#   bash benchmarks/gpu/gpu_health.sh
# Writes into $OUT (default $PWD/gpu-health-out): summary.txt, doctor.json, doctor.err,
# nvml-recording.json, watch-cost.json, watch-cost.txt, watch-cost-serve.log.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/gpu-health-out}
mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET=${BUDGET:-150}
summary="$OUT/summary.txt"
: >"$summary"
source "$(dirname "$0")/common.sh"
unpack_payload "$D"
export PYTHONPATH=$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
stamp "gpu health: $(nproc) cores, $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

# 1. doctor over the real NVML (exit 1 is expected where the image's packages differ from the lock)
s=$(ms)
timeout 90 $PY -m dflashctl doctor --json --expect-gpus "$gpus" --record-nvml "$OUT/nvml-recording.json" \
  >"$OUT/doctor.json" 2>"$OUT/doctor.err"
stamp "doctor: exit $? after $(secs_since "$s")s"
$PY - "$OUT/doctor.json" >>"$summary" 2>&1 <<'PYEOF'
import json, sys
fp = json.load(open(sys.argv[1]))
for c in fp["checks"]:
    if c["name"] in ("driver", "gpus") or c["name"].startswith("gpu-health"):
        print(f"  {c['status']:<4}  {c['name']}: {c['summary']}" + (f"\n        fix: {c['fix']}" if c["fix"] else ""))
for g in (fp.get("gpus") or {}).get("facts", {}).get("gpus", []):
    print(f"  GPU {g['index']} raw figures: {json.dumps(g.get('health'), sort_keys=True)}")
print(f"  unanswered: {(fp.get('gpus') or {}).get('facts', {}).get('unanswered')}")
PYEOF

# 2. the watch's cost on the decode path
limit=$(( $(left) - 5 ))
[ "$limit" -gt 40 ] || { stamp "watch cost: skipped, ${limit}s left"; cat "$summary"; exit 0; }
stamp "watch cost: start (limit ${limit}s)"
s=$(ms)
# (checked without a GPU with DFLASHCTL_SGLANG_LAUNCHER set to a stand-in SGLang: watch_cost.py --launcher)
timeout --signal=INT --kill-after=20 "$limit" $PY benchmarks/gpu/watch_cost.py --out "$OUT" --python "$(command -v $PY)" \
  >>"$summary" 2>&1
stamp "watch cost: exit $? after $(secs_since "$s")s"
grep -E "ready after|KV Cache|Traceback|Error|GPU watch" "$OUT/watch-cost-serve.log" 2>/dev/null | cut -c1-300 | head -12 \
  | sed 's/^/  serve: /' >>"$summary"
cat "$summary"
