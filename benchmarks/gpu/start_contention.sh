#!/usr/bin/env bash
# Where a first start goes once nothing compiles (issue 21): what the smoke's servers' imports
# compete with. Run after `RUNS=0 bash benchmarks/gpu/prebuilt_kernels.sh build` in the same
# device call (locked wheels in /tmp/site, prebuilt kernels for sm90 in /tmp/i21/prebuilt):
#   1. the smoke's default run side by side, each a fresh HOME with the prebuilt kernels and
#      FLASHINFER_DISABLE_JIT=1: `new` with this dflashctl (identity probes deprioritised, no JIT
#      prewarm where the prebuilt kernels cover the target), `prev` with PREV_PYTHON (the dflashctl
#      before that change: probes at full priority, the prewarm always started); `new`, `prev`,
#      `new` again, as time allows
#   2. imports: what a spawned scheduler child imports (SGLang's HTTP server and scheduler) alone,
#      then 8 at once (four servers' schedulers and detokenizers), then 8 at once beside the smoke's
#      identity probes (fingerprint.build) at full priority and deprioritised
#   3. one server alone (--runs baseline --no-grammar): a start with nothing beside it
# Also records NVML's answers (now with the compute capability) for tests/data/gpus.
# Writes summary.txt, <label>.json, nvml.json, logs-contention.tar.gz into $OUT.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/contention-out}
mkdir -p "$OUT"
K=/tmp/i21/prebuilt
RUNS_DIR=/tmp/i21/contention
PY=python3
summary="$OUT/summary.txt"
LOGS_TAR=$OUT/logs-contention.tar.gz
source "$(dirname "$0")/common.sh"
[ -f "$K/index.json" ] || { stamp "no prebuilt kernels in $K: run prebuilt_kernels.sh build first"; exit 3; }
NEW=$D/python
PREV=${PREV_PYTHON:?PREV_PYTHON: the previous dflashctl python tree}
export PYTHONPATH=$NEW:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$RUNS_DIR"; mkdir -p "$RUNS_DIR"
stamp "contention: $(nproc) cores, $(lscpu | grep -E '^(Thread|Core|Socket|Model name)' | tr -s ' ' | tr '\n' ';')"
stamp "autogroup: $(cat /proc/sys/kernel/sched_autogroup_enabled 2>&1), load $(cut -d' ' -f1-3 /proc/loadavg)"
$PY -m dflashctl doctor --record-nvml "$OUT/nvml.json" >/dev/null 2>&1
stamp "nvml recorded: $(grep -o '"compute_capability": "[0-9.]*"' "$OUT/nvml.json" | head -1)"

smoke_as() {  # label, python tree
  local label=$1 tree=$2
  PYTHONPATH=$tree:/tmp/site fresh_smoke "$label" DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
}
smoke_as new1 "$NEW"
smoke_as prev1 "$PREV"

imports_at_once() {  # label, count; then an optional command run beside them
  local label=$1 n=$2; shift 2
  local s i pids=() side=""
  s=$(ms)
  [ $# -gt 0 ] && { "$@" >"$RUNS_DIR/$label.side" 2>&1 & side=$!; }
  for i in $(seq 1 "$n"); do $PY -c "$SCHEDULER_IMPORTS" >"$RUNS_DIR/$label.$i" 2>&1 & pids+=($!); done
  wait "${pids[@]}"
  local took=$(secs_since "$s")
  [ -n "$side" ] && wait "$side"
  stamp "imports $label: $n at once, each $(cat "$RUNS_DIR/$label".[0-9]* | tail -n1 -q | sort -n | tr '\n' ' ')s; all done ${took}s$( [ -n "$side" ] && echo "; beside: $(tail -n1 "$RUNS_DIR/$label.side")")"
}
probe_host() {  # background: True or False
  $PY -c "import sys, time; from dflashctl.host import fingerprint
t = time.monotonic(); fp = fingerprint.build(sys.executable, None, 120, background=$1)
bad = [c['name'] for c in fp['checks'] if c['status'] == 'fail']
slowest = max(r.get('seconds') or 0 for r in fp['probes'].values())
print(f'fingerprint (background={$1}) {time.monotonic() - t:.1f}s, slowest probe {slowest}s, failing: {bad}')"
}
if [ "$(left)" -gt 150 ]; then
  imports_at_once alone 1
  imports_at_once eight 8
  imports_at_once eight-beside-probes 8 probe_host False
  imports_at_once eight-beside-background-probes 8 probe_host True
fi
[ "$(left)" -gt 100 ] && fresh_smoke alone DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 -- --runs baseline --no-grammar
[ "$(left)" -gt 100 ] && smoke_as new2 "$NEW"
[ "$(left)" -gt 100 ] && smoke_as prev2 "$PREV"
stamp "done"
