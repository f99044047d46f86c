#!/usr/bin/env bash
# What `enableMetrics` (SGLang's --enable-metrics, on by default) costs a real DFLASH instance's
# decoding on the H200, and `dflashctl status` over real instances and the router:
# benchmarks/gpu/metrics_cost.py (two oracle-pair instances, metrics on and off, started together;
# alternating rounds at 1 and 8 clients; then the router in front and `dflashctl status`).
#
# Needs what rollout.sh needs, on one warm machine: the stack's payload unpacked in /tmp/site
# (`source .gpu/setup.sh`) and the router's package in /tmp/router-site (carry .gpu-router, see
# rollout.sh's header). About 85 s after that when SGLang's JIT kernels are in ~/.cache already
# (run it after rollout.sh or smoke in the same call); METRICS_BUDGET sets the seconds (default 85).
#   source .gpu/setup.sh && bash benchmarks/gpu/metrics_cost.sh
# Writes into $OUT (default /tmp/metrics-cost-out): metrics-cost.txt (what it printed),
# metrics-cost.json (every round), status-h200.json / status-h200.txt, metrics-cost-logs.txt.
set -uo pipefail
OUT=${OUT:-/tmp/metrics-cost-out}; mkdir -p "$OUT"
[ -f /tmp/site/.unpacked ] || { echo "no /tmp/site: source .gpu/setup.sh first (see rollout.sh's header)"; exit 1; }
if ! [ -f /tmp/router-site/.unpacked ]; then
  [ -f .gpu-router/router.tar.xz ] || { echo "no /tmp/router-site and no .gpu-router/router.tar.xz (rollout.sh's header)"; exit 1; }
  mkdir -p /tmp/router-site && xz -d -T4 < .gpu-router/router.tar.xz | tar -x -C /tmp/router-site \
    && touch /tmp/router-site/.unpacked
fi
export PYTHONPATH=$PWD/python:/tmp/router-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
work=$(mktemp -d)
budget=${METRICS_BUDGET:-85}
timeout --signal=INT --kill-after=15 $((budget + 30)) python3 benchmarks/gpu/metrics_cost.py --work "$work" \
  --python "$(command -v python3)" --out "$OUT" --budget "$budget" 2>&1 | tee "$OUT/metrics-cost.txt"
echo "metrics_cost exit ${PIPESTATUS[0]}" | tee -a "$OUT/metrics-cost.txt"
for f in "$work"/serve-*.log "$work"/router.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "enable_metrics|KV Cache|Not enough|ready|READY|exit|Traceback|Error" "$f" | cut -c1-300 | head -30
    echo "===== $f (last 15 lines)"; tail -n 15 "$f" | cut -c1-300; } >>"$OUT/metrics-cost-logs.txt"
done
