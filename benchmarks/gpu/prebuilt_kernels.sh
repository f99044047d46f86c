#!/usr/bin/env bash
# First starts with SGLang's JIT kernels built ahead (issue 21), in two device calls:
#   prebuilt_kernels.sh build   unpack the locked wheels, `dflashctl kernels build` for sm90 and the
#                               smoke's shapes with NO GPU visible (CUDA_VISIBLE_DEVICES=), into
#                               /tmp/i21/prebuilt (the path the runs use), then `kernels status` and
#                               doctor's prebuilt-kernels line; then fresh default smokes (RUNS, default
#                               3) with the prebuilt kernels and FLASHINFER_DISABLE_JIT=1 (Triton's from
#                               the shipped sm90 recording; one more run after the first with Triton's
#                               own cache manager, the prebuilt Triton layer off, side by side)
#   prebuilt_kernels.sh cute    with nvidia-cutlass-dsl unpacked too (as on a Nix host): one fresh
#                               smoke on flashinfer's CuTe-DSL RMSNorm (FLASHINFER_USE_CUDA_NORM=0),
#                               one more with that run's CuTe cache kept, then one on the prebuilt nvcc
#                               norm (the default dflashctl picks when the prebuilt norm exists)
#   prebuilt_kernels.sh triton  one fresh smoke without prebuilt kernels that records Triton's
#                               kernels (DFLASH_TRITON_RECORD), then `kernels build` with NO GPU visible
#                               for sm90, the smoke's shapes and that recording, then fresh smokes
#                               with it (RUNS, default 3), and one between them with Triton's own
#                               cache manager (the prebuilt Triton layer off), side by side
# Every smoke: a fresh HOME and XDG cache (every JIT cache empty; dflashctl names them under
# $XDG_CACHE_HOME/dflashctl/jit), default smoke arguments. After each run it lists what the
# writable tvm-ffi cache and flashinfer's cache gained and the hook's lines from the servers' logs.
# Payload layout (folder D, default .gpu-i21): D/payload.tar.xz (gpu-payload, without the four CUDA
# compiler wheels: the image's nvcc 13.0 and g++ compile), D/cute.tar.xz (cutlass-dsl), D/python
# (a branch's dflashctl; without it, this tree's). Writes summary.txt, <label>.json, logs-<phase>.tar.gz into $OUT.
set -uo pipefail
phase=${1:?usage: prebuilt_kernels.sh build|cute|triton}
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/prebuilt-out}
mkdir -p "$OUT" /tmp/i21
K=/tmp/i21/prebuilt
RUNS_DIR=/tmp/i21/runs
PY=python3
summary="$OUT/summary.txt"
LOGS_TAR=$OUT/logs-$phase.tar.gz
source "$(dirname "$0")/common.sh"

unpack_payload "$D" || exit 3
if [ "$phase" = cute ] && [ ! -f /tmp/site/.cute ]; then
  xz -d -T8 <"$D/cute.tar.xz" | tar -x -C /tmp/site && touch /tmp/site/.cute
fi
CUTE_PATH=""
[ -f /tmp/site/.cute ] && CUTE_PATH=/tmp/site/nvidia_cutlass_dsl/python_packages:
py_dir=$D/python; [ -d "$py_dir" ] || py_dir=$REPO/python  # the payload's dflashctl, else this tree's
export PYTHONPATH=$py_dir:$CUTE_PATH/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
stamp "phase $phase: $(nproc) cores, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"

build_args=()
if [ "$phase" = triton ]; then
  REC=/tmp/i21/triton-record.jsonl
  rm -rf "$K" "$RUNS_DIR" "$REC"
  fresh_smoke record DFLASH_TRITON_RECORD="$REC"
  cp "$REC" "$OUT/triton-record-sm90.jsonl" 2>/dev/null
  stamp "recorded $(wc -l <"$REC" 2>/dev/null) kernel requests, $($PY -c "import json,sys; print(len({json.loads(l)['hash'] for l in open(sys.argv[1])}))" "$REC" 2>&1) distinct"
  build_args=(--triton-record "$REC")
fi
if [ "$phase" = build ] || [ "$phase" = triton ]; then
  rm -rf "$K"
  s=$(ms)
  CUDA_VISIBLE_DEVICES= $PY -m dflashctl kernels build --out "$K" --arch sm90 --smoke "${build_args[@]}" >"$OUT/build.txt" 2>&1
  rc=$?
  stamp "kernels build (no GPU visible): exit $rc after $(secs_since "$s")s"
  cat "$OUT/build.txt" | tail -20 | cut -c1-400 >>"$summary"
  ls "$K" "$K/flashinfer-aot" >>"$summary" 2>&1
  $PY -m dflashctl kernels status --dir "$K" --arch sm90 --smoke >>"$summary" 2>&1 ||
    { stamp "the prebuilt kernels do not cover the smoke: no runs"; cat "$OUT/build.txt" | tail -40; exit 1; }
  [ -f "$K/flashinfer-aot/norm/norm.so" ] || { stamp "no prebuilt flashinfer norm: no runs"; tail -40 "$OUT/build.txt"; exit 1; }
  s=$(ms)
  $PY -m dflashctl doctor --kernels "$K" >"$OUT/doctor.txt" 2>&1
  stamp "doctor: exit $? after $(secs_since "$s")s"
  grep -A1 prebuilt-kernels "$OUT/doctor.txt" >>"$summary"
  [ -d "$K/triton" ] && { du -sh "$K/triton" >>"$summary"; ls "$K/triton" | wc -l >>"$summary"; }
  for i in $(seq 1 "${RUNS:-3}"); do
    fresh_smoke "prebuilt$i" DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
    if [ -d "$K/triton" ] && [ "$i" = 1 ]; then
      fresh_smoke no-triton-layer DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 \
        TRITON_CACHE_MANAGER=triton.runtime.cache:FileCacheManager
    fi
  done
  # Where the imports go (Python's own -X importtime, every SGLang process): last, it slows the run.
  [ -n "${IMPORTTIME:-}" ] && fresh_smoke importtime DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 \
    PYTHONPROFILEIMPORTTIME=1
else
  CUTE_CACHE=/tmp/i21/cute-cache
  rm -rf "$CUTE_CACHE"
  $PY -c "import cutlass, cutlass.cute; from importlib.metadata import version; print('cutlass-dsl', version('nvidia-cutlass-dsl'))" >>"$summary" 2>&1
  CUTE_CACHE=$CUTE_CACHE fresh_smoke cute1 DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_USE_CUDA_NORM=0 \
    FLASHINFER_DISABLE_JIT=1 CUTE_DSL_CACHE_DIR="$CUTE_CACHE"
  fresh_smoke aot-with-cutlass DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
  CUTE_CACHE=$CUTE_CACHE fresh_smoke cute2-cache-kept DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_USE_CUDA_NORM=0 \
    FLASHINFER_DISABLE_JIT=1 CUTE_DSL_CACHE_DIR="$CUTE_CACHE"
fi
stamp "done"
cat "$summary"
