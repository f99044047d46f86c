#!/usr/bin/env bash
# The canary's spread on the H200: how far the after/before ratios of acceptance length and decode
# speed move between readings of an unchanged build, and how far the smoke's broken drafter moves
# them (issue 40). benchmarks/canary_spread.py --python: four real SGLang 0.5.11 instances under
# `dflashctl serve` on the one GPU (a and b: the oracle pair with DFLASH; broken: the same target
# with the broken pair's drafter, smoke's `--pair broken`; plain: the target alone), started
# together; then runs of the rollout's own canary (dflashctl.operations.canary, its defaults) judged
# at the default thresholds: a twice, a then b, plain twice (first 10 runs), a then broken (first 3
# runs, must fail), and in the last CANARY_RESTARTS runs b before and after a real restart of it.
#
# Device command, from the repository root, with the stack's payload carried as .gpu (it holds
# payload.tar.xz, benchmarks/README.md; no router needed):
#     bash benchmarks/gpu/canary_spread.sh
# (the `run` tool: carry [".gpu"], timeout 600). Expected on a fresh H200: unpacking ~10 s, byte
# code 12-15 s, four instances ready after 60-120 s, 30 runs of 2-10 s (the broken and plain
# readings are the long ones), two restarts of b of ~60 s each; hard stop at CANARY_BUDGET (530)
# seconds from the start: runs stop starting before it, and what was measured is printed.
# Knobs: CANARY_BUDGET (530), CANARY_RUNS (30), CANARY_RESTARTS (2), BYTECODE (1; 0 skips it),
# PAYLOAD_DIR (.gpu), PYTHON (python3), SERVE_ARGS (extra `dflashctl serve` arguments, split at
# spaces). A dry run without a GPU, in a private /tmp (the stand-in decodes the same pairs):
#   SERVE_ARGS=--skip-preflight DFLASHCTL_SGLANG_LAUNCHER="python3 tests/data/service/standin_server.py" \
#   STANDIN_STEP_DELAY=0.004 PAYLOAD_DIR=DIR-WITH-ANY-payload.tar.xz \
#   unshare -m sh -c 'mount -t tmpfs tmpfs /tmp && bash benchmarks/gpu/canary_spread.sh'
# Writes into $OUT (default $PWD/canary-spread-out): summary.txt, canary-spread-h200.txt (what it
# printed: a verdict line per comparison, then the table), canary-spread-h200.json (every figure),
# canary-spread-logs.txt (key lines and tails of the four instances' logs).
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu}
OUT=${OUT:-$PWD/canary-spread-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${CANARY_BUDGET:-530}
summary="$OUT/summary.txt"
: >"$summary"
source "$(dirname "$0")/common.sh"
unpack_payload "$D" || exit 3
stamp "payload: /tmp/site unpacked; $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -1)"
export PYTHONPATH=$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# Four instances import SGLang at once: from byte code that is seconds, without it each compiles.
compile_bytecode

work=$(mktemp -d)
secs=$(( $(left) - 5 ))
if [ "$secs" -lt 120 ]; then stamp "measurement skipped: ${secs}s left"; exit 4; fi
serve_args=()
[ -n "${SERVE_ARGS:-}" ] && read -r -a serve_args <<<"$SERVE_ARGS"
stamp "canary_spread.py: ${CANARY_RUNS:-30} runs, ${CANARY_RESTARTS:-2} restarts, budget ${secs}s"
timeout --signal=INT --kill-after=15 "$secs" $PY benchmarks/canary_spread.py --python "$(command -v "$PY")" \
  --work "$work" --runs "${CANARY_RUNS:-30}" --restarts "${CANARY_RESTARTS:-2}" --budget "$((secs - 25))" \
  --json "$OUT/canary-spread-h200.json" "${serve_args[@]/#/--serve-arg=}" 2>&1 | tee "$OUT/canary-spread-h200.txt"
stamp "canary_spread.py: exit ${PIPESTATUS[0]}"
grep -E "^\| |^Within|^Machine|^stopped|ready after" "$OUT/canary-spread-h200.txt" >>"$summary"
for f in "$work"/serve-*.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "KV Cache|max_total_num_tokens|Not enough|ready|READY|exit|Traceback|Error" "$f" | cut -c1-300 | head -30
    echo "===== $f (last 15 lines)"; tail -n 15 "$f" | cut -c1-300; } >>"$OUT/canary-spread-logs.txt"
done
stamp "done"
