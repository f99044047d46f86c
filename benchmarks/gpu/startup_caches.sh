#!/usr/bin/env bash
# Which on-disk cache makes a second SGLang start fast? Three default `dflashctl smoke` runs on a
# fresh machine, each with a fresh HOME (so ~/.cache, ~/.nv, ~/.triton start empty) and explicit
# caches:
#   cold         fresh Triton cache, fresh CUDA JIT cache (CUDA_CACHE_PATH)
#   warm-cuda    fresh Triton cache, run 1's CUDA JIT cache
#   warm-triton  run 1's Triton cache, fresh CUDA JIT cache
# Run from the repo root (the script sets the stack up: benchmarks/README.md); writes summary.txt and <run>.json into $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/startup-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
ms() { echo $(( $(date +%s%N) / 1000000 )); }
run() {  # label, triton cache, CUDA JIT cache
  local label=$1 triton=$2 cuda=$3 t0 rc
  mkdir -p "/tmp/home-$label"
  t0=$(ms)
  HOME=/tmp/home-$label CUDA_CACHE_PATH=$cuda TORCHINDUCTOR_CACHE_DIR=/tmp/home-$label/inductor \
    timeout -k 5 300 python3 -m dflashctl smoke --triton-cache "$triton" --work-dir "/tmp/work-$label" \
    --json "$OUT/$label.json" >"/tmp/$label.out" 2>&1
  rc=$?
  echo "$label: exit $rc after $(( ($(ms) - t0) / 1000 )) s (triton cache $triton, CUDA JIT cache $cuda)" | tee -a "$OUT/summary.txt"
  grep -E '^(baseline|DFLASH|DDTREE) |^phases' "/tmp/$label.out" | tee -a "$OUT/summary.txt"
  du -sh "$triton" "$cuda" "/tmp/home-$label" 2>/dev/null | sed 's/^/  size /' | tee -a "$OUT/summary.txt"
}
: >"$OUT/summary.txt"
run cold /tmp/triton-1 /tmp/cuda-1
run warm-cuda /tmp/triton-2 /tmp/cuda-1
run warm-triton /tmp/triton-1 /tmp/cuda-3
