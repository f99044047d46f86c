#!/usr/bin/env bash
# What `enableMetrics` (SGLang's --enable-metrics, on by default) costs a real DFLASH instance's
# decoding on the H200, and `dflashctl status` over real instances (and the router, where carried):
# benchmarks/gpu/metrics_cost.py (two oracle-pair instances, metrics on and off, started together;
# alternating rounds at 1 and 8 clients; then `dflashctl status` over both, the real NVML's GPU
# health included, with sglang-router 0.3.2 in front where its package is here).
#
# Device command, from the repository root, with the stack's payload carried as .gpu (it holds
# payload.tar.xz; unpacked once a machine into /tmp/site, as common.sh does for the other scripts):
#     bash benchmarks/gpu/metrics_cost.sh
# The router is optional: where .gpu-router/router.tar.xz is carried too (rollout.sh's header says
# how to make it), or /tmp/router-site was unpacked by an earlier call on the same warm machine,
# status shows the router row; without it the measurement and the instances' rows are the same and
# the router is named as not carried.
# Where both payloads do not fit one transfer, two calls on one warm machine (/tmp stays):
#   1. carry [".gpu"]:         METRICS_BUDGET=1 bash benchmarks/gpu/metrics_cost.sh   (unpacks, byte code; exit 4)
#   2. carry [".gpu-router"]:  bash benchmarks/gpu/metrics_cost.sh
# Expected: 100-120 s on a fresh H200 (unpacking ~10 s, byte code 12-15 s, both instances ready
# after 45-60 s, 12 rounds of 2.5 s, status ~10 s); hard stop at METRICS_BUDGET (120) seconds from the
# start, each phase cut short with a note where the budget runs out. Faster where an earlier script
# of the same call left byte code or warm JIT caches in $HOME.
# Knobs: METRICS_BUDGET (120), METRICS_ROUND (2.5, seconds per round), BYTECODE (1; 0 skips it),
# PAYLOAD_DIR (.gpu), ROUTER_PAYLOAD (.gpu-router/router.tar.xz), PYTHON (python3), SERVE_ARGS (extra
# `dflashctl serve` arguments, split at spaces). A dry run without a GPU, in a private /tmp:
#   SERVE_ARGS=--skip-preflight DFLASHCTL_SGLANG_LAUNCHER="python3 tests/data/service/standin_server.py" \
#   PAYLOAD_DIR=DIR-WITH-ANY-payload.tar.xz unshare -m sh -c 'mount -t tmpfs tmpfs /tmp && bash benchmarks/gpu/metrics_cost.sh'
# Writes into $OUT (default $PWD/metrics-cost-out): summary.txt, metrics-cost.txt (what it
# printed), metrics-cost.json (every round), status-h200.json / status-h200.txt, metrics-cost-logs.txt.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu}
OUT=${OUT:-$PWD/metrics-cost-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${METRICS_BUDGET:-120}
summary="$OUT/summary.txt"
: >"$summary"
source "$(dirname "$0")/common.sh"
unpack_payload "$D" || exit 3
stamp "payload: /tmp/site unpacked; $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -1)"

router_site=$ROUTER_SITE
[ -f "$ROUTER_PAYLOAD" ] && router_setup  # optional here: without it, status and the cost without the router
export PYTHONPATH=$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
router_arg=()
if [ -f "$router_site/.unpacked" ]; then
  export PYTHONPATH=$PYTHONPATH:$router_site
  stamp "router: sglang-router from $router_site"
elif $PY -c "import sglang_router" 2>/dev/null; then
  stamp "router: sglang-router as installed here"
else
  router_arg=(--no-router)
  stamp "router: not carried (no $router_site, no $ROUTER_PAYLOAD): measuring and status without it"
fi

compile_bytecode

work=$(mktemp -d)
secs=$(( $(left) - 3 ))
if [ "$secs" -lt 40 ]; then stamp "measurement skipped: ${secs}s left"; exit 4; fi
serve_args=()
[ -n "${SERVE_ARGS:-}" ] && read -r -a serve_args <<<"$SERVE_ARGS"
stamp "metrics_cost.py: budget ${secs}s ${router_arg[*]}"
timeout --signal=INT --kill-after=10 "$secs" $PY benchmarks/gpu/metrics_cost.py --work "$work" \
  --python "$(command -v "$PY")" --out "$OUT" --budget "$((secs - 2))" --round "${METRICS_ROUND:-2.5}" \
  "${router_arg[@]}" "${serve_args[@]/#/--serve-arg=}" 2>&1 | tee "$OUT/metrics-cost.txt"
stamp "metrics_cost.py: exit ${PIPESTATUS[0]}"
grep -E "client\(s\): median|cut short|status --json: exit|^# exit|^router |^total " "$OUT/metrics-cost.txt" >>"$summary"
for f in "$work"/serve-*.log "$work"/router.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "enable_metrics|KV Cache|Not enough|ready|READY|exit|Traceback|Error" "$f" | cut -c1-300 | head -30
    echo "===== $f (last 15 lines)"; tail -n 15 "$f" | cut -c1-300; } >>"$OUT/metrics-cost-logs.txt"
done
stamp "done"
