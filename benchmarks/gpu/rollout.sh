#!/usr/bin/env bash
# Two real SGLang 0.5.11 DFLASH instances (the smoke's oracle pair) on the one H200 behind
# sglang-router 0.3.2, upgraded under load: benchmarks/rollout_bench.py (`dflashctl rollout`, then
# every instance restarted at once, side by side), after benchmarks/gpu/record_metrics.py saved what
# one instance and the router serve to a monitor (/metrics, /v1/loads, /server_info, /workers).
#
# The stack's payload (.gpu) and the router's (.gpu-router: the sglang_router package of the wheel
# nix/router-lock.json pins, unpacked) do not fit one transfer, so two calls on one warm machine
# (it keeps /tmp for ~30 s between them):
#   1. carry [".gpu"]:         source benchmarks/gpu/setup.sh   (or any script of that call)
#   2. carry [".gpu-router"]:  bash benchmarks/gpu/rollout.sh
# Make .gpu-router with:  mkdir -p .gpu-router /tmp/rs && (cd /tmp/rs && unzip -q WHEEL) &&
#                         tar -C /tmp/rs -cf - . | xz -T2 -9 > .gpu-router/router.tar.xz
#
# Both instances share the GPU: SGLang 0.5.11 sizes a pool as the free memory minus (1 -
# memFractionStatic) x the total, so an instance restarting beside another that holds f x total
# would get nothing; with --max-total-tokens capping every pool (as the smoke does) each holds a
# few GiB and either can restart beside the other (docs/service.md, "Sharing a GPU").
# Writes into $OUT: rollout-h200.txt (tables), rollout-h200.json, metrics/ (the recordings),
# rollout-h200-logs.txt. Knobs: ROLLOUT_MODE (both; rolling or all: one of the two upgrades only),
# RECORD_METRICS (1; 0 skips the recordings), ROLLOUT_LIMIT (420 s for the benchmark), FAST_START (set:
# both instances with `fastStart`, issue 44's rollout with each instance's time out of rotation;
# `default`: neither names it, the setting's default; unset: both off), PORT_TAKEN (0; 1: afterwards
# benchmarks/gpu/port_taken.py on instance a, into $OUT/port-taken.txt).
set -uo pipefail
OUT=${OUT:-/tmp/rollout-out}; mkdir -p "$OUT/metrics"
source "$(dirname "$0")/common.sh"
stack_setup || exit 1
router_setup || exit 1
export PYTHONPATH=$PWD/python:/tmp/router-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
work=$(mktemp -d)
PY=python3 compile_bytecode  # as a Nix build leaves it (once a machine)
case "${FAST_START:-}" in default) fast=(--default-fast-start) ;; "") fast=() ;; *) fast=(--fast-start) ;; esac
python3 benchmarks/gpu/two_instances.py "$work" "${fast[@]}" || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import sglang_router, importlib.metadata as m; print('sglang', m.version('sglang'), '| sglang-router', sglang_router.__version__)"
} >"$OUT/rollout-h200.txt" 2>&1
if [ "${RECORD_METRICS:-1}" = 1 ]; then
  timeout --signal=INT 200 python3 benchmarks/gpu/record_metrics.py --instance "$work/a.json" --python "$(command -v python3)" \
    --out "$OUT/metrics" >>"$OUT/rollout-h200.txt" 2>&1
  echo "record_metrics exit $?" >>"$OUT/rollout-h200.txt"
fi
timeout --signal=INT "${ROLLOUT_LIMIT:-420}" python3 benchmarks/rollout_bench.py --instance "$work/a.json" \
  --instance "$work/b.json" --python "$(command -v python3)" --mode "${ROLLOUT_MODE:-both}" --clients 8 --before 10 --after 10 --healthy-for 5 \
  --start-timeout 600 --json "$OUT/rollout-h200.json" --work-dir "$work/bench" >>"$OUT/rollout-h200.txt" 2>&1
echo "rollout_bench exit $?" >>"$OUT/rollout-h200.txt"
if [ "${PORT_TAKEN:-0}" = 1 ]; then  # then instance a's port held by another program (port_taken.py)
  timeout 300 python3 benchmarks/gpu/port_taken.py "$work/a.json" "$work/bench" >"$OUT/port-taken.txt" 2>&1
  echo "port_taken exit $?" >>"$OUT/port-taken.txt"
fi
for f in "$work"/bench/serve-*.log "$OUT"/metrics/serve-*.log "$work"/bench/router.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "KV Cache|max_total_num_tokens|Not enough|ready|READY|exit|Traceback|Error|preflight|faststart" "$f" | cut -c1-300 | head -40
    echo "===== $f (last 20 lines)"; tail -n 20 "$f" | cut -c1-300; } >>"$OUT/rollout-h200-logs.txt"
done
rm -f "$OUT"/metrics/*.log
cat "$OUT/rollout-h200.txt"
