#!/usr/bin/env bash
# The default `dflashctl smoke` (oracle pair) on a fresh GPU machine, then `--pair broken`.
#
# Run from the repository root; the script puts the locked wheels on PYTHONPATH (common.sh) and
# this checkout's python/ first, e.g. through the device tool:
#     bash benchmarks/gpu/smoke_oracle.sh
# CODE (default: the repository root) is where python/dflashctl is taken from.
#
# 1. the default smoke: baseline, DFLASH (oracle drafter), DFLASH-poisoned, the grammar server;
#    fresh caches (a new machine), --record and --keep-logs;
# 2. if at least SMOKE_BROKEN_MIN (120) of SMOKE_BUDGET (420) seconds are left: `--pair broken
#    --no-grammar`, which must end with exit 6 (drafts rejected), also recorded.
# Writes into $OUT: summary.txt, oracle.json, oracle.out, oracle-recorded.tar.gz,
# oracle-logs.tar.gz, broken.json, broken.out, broken-recorded.tar.gz.
set -uo pipefail
OUT=${OUT:-$PWD/smoke-out}
CODE=${CODE:-$PWD}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH="$CODE/python${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
BUDGET=${SMOKE_BUDGET:-420}
summary="$OUT/summary.txt"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
stamp() { printf '%5ss  %s\n' "$(( $(date +%s) - T0 ))" "$*" | tee -a "$summary"; }

{
  machine_facts sglang sglang-kernel torch triton xgrammar transformers
} >"$summary"

run_smoke() {  # $1 label, $2 seconds, then smoke arguments
  local label=$1 secs=$2; shift 2
  rm -rf "/tmp/so-$label"
  stamp "$label: dflashctl smoke $*"
  timeout --signal=TERM --kill-after=15 "$secs" "$PY" -m dflashctl smoke --work-dir "/tmp/so-$label/work" \
    --triton-cache /tmp/so-triton --json "$OUT/$label.json" --record "/tmp/so-$label/rec" \
    --keep-logs "/tmp/so-$label/logs" "$@" >"$OUT/$label.out" 2>&1
  local rc=$?
  stamp "$label: exit $rc"
  [ -d "/tmp/so-$label/rec" ] && tar -C "/tmp/so-$label/rec" -czf "$OUT/$label-recorded.tar.gz" .
  return $rc
}

run_smoke oracle 300
rc=$?
[ -d /tmp/so-oracle/logs ] && tar -C /tmp/so-oracle/logs -czf "$OUT/oracle-logs.tar.gz" .
if [ "$(left)" -ge "${SMOKE_BROKEN_MIN:-120}" ]; then
  run_smoke broken "$(( $(left) - 10 ))" --pair broken --no-grammar
else
  stamp "broken: skipped ($(left)s left)"
fi
{
  echo "== tables"
  for l in oracle broken; do
    [ -f "$OUT/$l.out" ] && { echo "--- $l"; grep -v '^\[smoke\]' "$OUT/$l.out" | head -n 60; }
  done
} >>"$summary" 2>&1
cat "$summary"
exit $rc
