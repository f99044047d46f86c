#!/usr/bin/env bash
# The default `dflashctl smoke` on a fresh GPU machine, timed phase by phase.
#
# Run from the repository root; the script sets the stack up (common.sh: locked wheels in /tmp/site on
# PYTHONPATH), e.g. through the device tool with carry [".gpu"]:
#     bash benchmarks/gpu/smoke.sh
#
# A: the default smoke (oracle pair: baseline, DFLASH, DFLASH-poisoned [+ DDTREE], the grammar server;
#    pass --pair random for the random-weight pair these results were first taken with), fresh Triton cache.
# B: only if enough time is left: $SMOKE_B_ARGS (default `--launch sequential`) with its own fresh
#    Triton cache, to compare with A (Python imports are warm for B: its start is slightly flattered).
# Extra arguments go to both runs, e.g. `bash benchmarks/gpu/smoke.sh --cuda-graph-bs 1,8`.
#
# Writes at most 8 files into $OUT (default ./smoke-out): summary.txt, A.json, A.out, A-logs.txt,
# A-recorded.tar.gz (replayable responses for tests/data/smoke), B.json, B.out, B-logs.txt.
# Budget: ~9 minutes in all (A gets up to 330 s, B what is left of 520 s).
set -uo pipefail
OUT=${OUT:-$PWD/smoke-out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
BUDGET=${SMOKE_BUDGET:-520}
B_ARGS=${SMOKE_B_ARGS:---launch sequential}  # run B's flags: the alternative to compare with A
summary="$OUT/summary.txt"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
T0=$(ms)
secs_since() { local d=$(( $(ms) - $1 )); printf '%d.%01d' $((d / 1000)) $((d % 1000 / 100)); }
stamp() { printf '%7ss  %s\n' "$(secs_since "$T0")" "$*" | tee -a "$summary"; }
left() { echo $(( BUDGET - ($(ms) - T0) / 1000 )); }

# Where start-up time goes, from SGLang's own log lines (kept whole; the rest is a tail).
KEY='Load weight|Capture|capture|piecewise|Memory pool|KV Cache|max_total_num_tokens|ready to roll|Uvicorn running|Traceback|Error|error:|exited|DFLASH|dflash|draft'

logs_of() {  # $1 work dir, $2 output file
  : >"$2"
  for f in "$1"/logs/*.log; do
    [ -e "$f" ] || continue
    { echo "===== $(basename "$f"): key lines"; grep -E "$KEY" "$f" | cut -c1-400 | head -n 200
      echo "===== $(basename "$f"): last 80 lines"; tail -n 80 "$f" | cut -c1-400; } >>"$2"
  done
}

run_smoke() {  # $1 label, $2 seconds, then smoke arguments
  local label=$1 secs=$2; shift 2
  local work=/tmp/smoke-$label
  rm -rf "$work" "/tmp/triton-$label"
  stamp "$label: start (limit ${secs}s): dflashctl smoke $*"
  local s
  s=$(ms)
  timeout --signal=TERM --kill-after=15 "$secs" "$PY" -m dflashctl smoke --work-dir "$work" \
    --triton-cache "/tmp/triton-$label" --json "$OUT/$label.json" "$@" >"$OUT/$label.out" 2>&1
  local rc=$?
  stamp "$label: exit $rc after $(secs_since "$s")s"
  logs_of "$work" "$OUT/$label-logs.txt"
  return $rc
}

{
  machine_facts sglang sglang-kernel torch triton xgrammar transformers flashinfer-python
  echo "== timeline (seconds since the script started)"
} >"$summary"

stamp "dflashctl smoke --help (import check)"
"$PY" -m dflashctl smoke --help >/dev/null || { stamp "dflashctl does not import"; exit 1; }

run_smoke A 330 --record /tmp/smoke-A-rec "$@"
rcA=$?
if [ -d /tmp/smoke-A-rec ]; then tar -C /tmp/smoke-A-rec -czf "$OUT/A-recorded.tar.gz" .; fi

if [ "$(left)" -ge "${SMOKE_B_MIN:-240}" ]; then
  # shellcheck disable=SC2086  # B_ARGS is a list of flags
  run_smoke B "$(left)" $B_ARGS "$@"
else
  stamp "B: skipped ($(left)s left of ${BUDGET}s)"
fi

{
  echo "== tables"
  for l in A B; do
    [ -f "$OUT/$l.out" ] || continue
    echo "--- $l"; grep -v '^\[smoke\]' "$OUT/$l.out" | head -n 30
  done
  echo "== phases_s from the JSON"
  for l in A B; do
    [ -f "$OUT/$l.json" ] && "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['ok'], r['phases_s'], [(x['name'], x['startup_s']) for x in r['runs']])" "$OUT/$l.json" "$l"
  done
} >>"$summary" 2>&1
cat "$summary"
exit $rcA
