#!/usr/bin/env bash
# Issue 40 on the H200: two real SGLang 0.5.11 DFLASH instances (the smoke's oracle pair) behind
# sglang-router 0.3.2 under load, rolled to the smoke's broken drafter (`--pair broken`: it reads
# one position off, acceptance about 1 where the good one gives 16, outputs identical). Expected:
# the canary stops the rollout at the first instance ("measure after": acceptance length 16 -> ~1,
# below 0.9x, and decode speed), exit 7, 0 failed requests, the second instance never restarted;
# then the revert (the old drafter back, `rollout --resume`) puts the first back on the old build,
# and a rollout to the identical build passes (speed judged at the default 0.8).
# benchmarks/rollout_bench.py --to-drafter runs the three as modes to-drafter, revert, rolling.
#
# Same two calls as benchmarks/gpu/rollout.sh (the stack's payload, then the router's):
#   1. carry [".gpu"]:         source benchmarks/gpu/setup.sh
#   2. carry [".gpu-router"]:  bash benchmarks/gpu/rollout_canary.sh
# Writes into $OUT: rollout-canary-h200.txt (tables), rollout-canary-h200.json, rollout-canary-h200-logs.txt.
# Knob: ROLLOUT_LIMIT (540 s).
set -uo pipefail
OUT=${OUT:-/tmp/rollout-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 1
router_setup || exit 1
export PYTHONPATH=$PWD/python:/tmp/router-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
work=$(mktemp -d)
python3 benchmarks/gpu/two_instances.py "$work" --broken || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import sglang_router, importlib.metadata as m; print('sglang', m.version('sglang'), '| sglang-router', sglang_router.__version__)"
} >"$OUT/rollout-canary-h200.txt" 2>&1
timeout --signal=INT "${ROLLOUT_LIMIT:-540}" python3 benchmarks/rollout_bench.py --instance "$work/a.json" \
  --instance "$work/b.json" --python "$(command -v python3)" --to-drafter "$(cat "$work/broken-drafter")" \
  --clients 8 --before 10 --after 10 --healthy-for 5 --start-timeout 600 --json "$OUT/rollout-canary-h200.json" \
  --work-dir "$work/bench" >>"$OUT/rollout-canary-h200.txt" 2>&1
echo "rollout_bench exit $?" >>"$OUT/rollout-canary-h200.txt"
for f in "$work"/bench/serve-*.log "$work"/bench/router.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "ready|READY|exit|Traceback|Error|preflight" "$f" | cut -c1-300 | head -40
    echo "===== $f (last 20 lines)"; tail -n 20 "$f" | cut -c1-300; } >>"$OUT/rollout-canary-h200-logs.txt"
done
cat "$OUT/rollout-canary-h200.txt"
