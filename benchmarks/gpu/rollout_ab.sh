#!/usr/bin/env bash
# rollout.sh twice on one warm machine: first with a baseline dflashctl (another commit's), then with
# this tree's, so two figures of an instance's time out of rotation come from the same GPU and the
# same caches. The baseline travels as a directory (an ignored path, given to the run's carry):
#   mkdir -p .ab/x && git archive REV python/dflashctl | tar -x -C .ab/x && mv .ab/x/python/dflashctl .ab/
# Call 1 as for rollout.sh (carry [".gpu"], stack_setup); call 2 carry [".gpu-router", ".ab"]:
#   BASELINE=.ab/dflashctl bash benchmarks/gpu/rollout_ab.sh
# Or the baseline is this tree's dflashctl with some of the stack's files as published instead of as
# the Nix stack's fix-ups edit them (stack_fixups keeps each published file as FILE.orig), e.g. to
# measure overlays/fixups/sglang.nix's promptReadiness (call 2 carry [".gpu-router"] only):
#   BASELINE_PUBLISHED="sglang/srt/entrypoints/http_server.py" bash benchmarks/gpu/rollout_ab.sh
# Writes $OUT/baseline and $OUT/this (rollout.sh's files each) and prints both tables. The
# baseline's run goes first, so only its first start pays the JIT caches' compile; the restarts
# measured find them warm in both. Knobs as rollout.sh's (FAST_START, ROLLOUT_MODE default rolling,
# RECORD_METRICS default 0, ROLLOUT_LIMIT default 300).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
# rollout.sh sets the stack up itself (stack_setup), once a machine
source "$(dirname "$0")/common.sh"
: "${BASELINE:=}" "${BASELINE_PUBLISHED:=}"
[ -n "$BASELINE$BASELINE_PUBLISHED" ] || { echo "rollout_ab: set BASELINE or BASELINE_PUBLISHED (see the head of this script)" >&2; exit 2; }
[ -z "$BASELINE" ] || [ -f "$BASELINE/__init__.py" ] || { echo "rollout_ab: $BASELINE is not a dflashctl package directory" >&2; exit 2; }
stack_setup || exit 1
for f in $BASELINE_PUBLISHED; do
  [ -f "$SITE/$f.orig" ] || { echo "rollout_ab: $SITE/$f.orig is missing: no fix-up edited $f (prepare_fixups.sh)" >&2; exit 2; }
done
# swap_published: the listed stack files as published (1) or as the fix-ups left them (0), their
# byte code compiled again either way (a Nix build's is compiled; a stale one would be recompiled
# at the first import of every process)
swap_published() {
  local f
  for f in $BASELINE_PUBLISHED; do
    [ -f "$SITE/$f.fixed" ] || cp "$SITE/$f" "$SITE/$f.fixed"
    if [ "$1" = 1 ]; then cp "$SITE/$f.orig" "$SITE/$f"; else cp "$SITE/$f.fixed" "$SITE/$f"; fi
    python3 -m compileall -q -f "$SITE/$f" >/dev/null
  done
}
export ROLLOUT_MODE=${ROLLOUT_MODE:-rolling} RECORD_METRICS=${RECORD_METRICS:-0} ROLLOUT_LIMIT=${ROLLOUT_LIMIT:-300}
root=${OUT:-/tmp/rollout-ab}; keep=$(mktemp -d)
cp -r "$repo/python/dflashctl" "$keep/"
restore() { rm -rf "$repo/python/dflashctl"; cp -r "$keep/dflashctl" "$repo/python/"; swap_published 0; }
trap restore EXIT
[ -z "$BASELINE" ] || { rm -rf "$repo/python/dflashctl"; cp -r "$BASELINE" "$repo/python/dflashctl"; }
swap_published 1
OUT=$root/baseline bash "$here/rollout.sh" >/dev/null 2>&1
restore
OUT=$root/this bash "$here/rollout.sh" >/dev/null 2>&1
for side in baseline this; do
  echo "== $side"
  grep -E "^rolling:|^  [ab]: |rollout_bench exit" "$root/$side/rollout-h200.txt"
  grep -hE "ready after|preflight: .*passed" "$root/$side/rollout-h200-logs.txt" | sort | uniq -c | head -12
done
