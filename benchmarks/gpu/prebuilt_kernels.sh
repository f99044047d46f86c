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
# (this branch's dflashctl). Writes summary.txt, <label>.json, logs-<phase>.tar.gz into $OUT.
set -uo pipefail
phase=${1:?usage: prebuilt_kernels.sh build|cute|triton}
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/prebuilt-out}
mkdir -p "$OUT" /tmp/i21
K=/tmp/i21/prebuilt
RUNS_DIR=/tmp/i21/runs
PY=python3
BUDGET=${BUDGET:-540}
summary="$OUT/summary.txt"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
T0=$(ms)
secs_since() { local d=$(( $(ms) - $1 )); printf '%d.%01d' $((d / 1000)) $((d % 1000 / 100)); }
stamp() { printf '%7ss  %s\n' "$(secs_since "$T0")" "$*" | tee -a "$summary"; }
left() { echo $(( BUDGET - ($(ms) - T0) / 1000 )); }

if [ ! -f /tmp/site/.unpacked ]; then
  [ -f "$D/payload.tar.xz" ] || { echo "no /tmp/site and no $D/payload.tar.xz: run the build phase first" | tee -a "$summary"; exit 3; }
  mkdir -p /tmp/site && xz -d -T8 <"$D/payload.tar.xz" | tar -x -C /tmp/site && touch /tmp/site/.unpacked
fi
if [ "$phase" = cute ] && [ ! -f /tmp/site/.cute ]; then
  xz -d -T8 <"$D/cute.tar.xz" | tar -x -C /tmp/site && touch /tmp/site/.cute
fi
CUTE_PATH=""
[ -f /tmp/site/.cute ] && CUTE_PATH=/tmp/site/nvidia_cutlass_dsl/python_packages:
export PYTHONPATH=$D/python:$CUTE_PATH/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
stamp "phase $phase: $(nproc) cores, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"

smoke_fresh() {  # label, then NAME=VALUE settings for the run (env), then -- and smoke arguments
  local label=$1; shift
  local dir=$RUNS_DIR/$label settings=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  rm -rf "$dir"; mkdir -p "$dir/home"
  local secs; secs=$(left); [ "$secs" -gt 170 ] && secs=170
  if [ "$secs" -lt 50 ]; then stamp "$label: skipped, ${secs}s left"; return 1; fi
  stamp "$label: start (${settings[*]}) limit ${secs}s"
  local s rc; s=$(ms)
  env -u TVM_FFI_CACHE_DIR -u FLASHINFER_WORKSPACE_BASE -u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR \
    -u CUDA_CACHE_PATH -u CUTE_DSL_CACHE_DIR HOME="$dir/home" XDG_CACHE_HOME="$dir/home/.cache" "${settings[@]}" \
    timeout --signal=TERM --kill-after=15 "$secs" $PY -m dflashctl smoke --work-dir "$dir/work" \
    --keep-logs "$dir/logs" --json "$OUT/$label.json" "$@" >"$dir/smoke.out" 2>&1
  rc=$?
  stamp "$label: exit $rc after $(secs_since "$s")s"
  local jit=$dir/home/.cache/dflashctl/jit
  {
    grep -v '^\[smoke\]' "$dir/smoke.out" | cut -c1-400
    echo "  writable tvm-ffi cache ($jit/tvm-ffi): $(ls "$jit/tvm-ffi" 2>/dev/null | wc -l) entries: $(ls "$jit/tvm-ffi" 2>/dev/null | tr '\n' ' ')"
    echo "  flashinfer cache: $(find "$jit/flashinfer" -name '*.so' 2>/dev/null | tr '\n' ' ')"
    echo "  CuTe-DSL cache: $(du -sh "${CUTE_CACHE:-$jit/cute-dsl}" 2>/dev/null | cut -f1) $(find "${CUTE_CACHE:-$jit/cute-dsl}" -type f 2>/dev/null | wc -l) files"
    local tc=$dir/home/.cache/dflashctl/triton
    echo "  triton cache: $(find "$tc" -mindepth 1 -maxdepth 1 -type d ! -empty 2>/dev/null | wc -l) entries with files," \
      "$(find "$tc" -name '__grp__*' 2>/dev/null | wc -l) kernels, $(find "$tc" -name '*.so' 2>/dev/null | wc -l) helper modules:" \
      "$(find "$tc" -name '__grp__*' 2>/dev/null | sed 's/.*__grp__//; s/\.json$//' | sort | uniq -c | tr -s ' \n' ' ')"
    echo "  hook lines in the servers' logs:"
    cat "$dir"/logs/*.log 2>/dev/null | grep -ho '\[dflash kernels\].*' | sort | uniq -c | cut -c1-250 | sed 's/^/    /'
    echo "  flashinfer / JIT mentions:"
    cat "$dir"/logs/*.log 2>/dev/null | grep -hiE 'MissingJITCache|JIT compilation is disabled|cutlass|cute' | head -5 | cut -c1-200 | sed 's/^/    /'
  } >>"$summary"
  if [ -f "$OUT/$label.json" ]; then
    $PY - "$OUT/$label.json" "$label" >>"$summary" 2>&1 <<'PYEOF'
import json, sys
r, label = json.load(open(sys.argv[1])), sys.argv[2]
p = r.get("phases_s", {})
print(f"=== {label}: ok {r['ok']}, start to table {p.get('start to table')} s, "
      + ", ".join(f"{x['name']} ready {x['startup_s']} s" for x in r.get("runs", [])))
for x in r.get("runs", []):
    print(f"    {x['name']} start-up: {(x.get('startup') or {}).get('seconds')}")
    if x.get("lossless"):
        print(f"    {x['name']} lossless: {x['lossless']}")
pre = r.get("jit_prewarm") or {}
print(f"    prewarm: {json.dumps({k: pre.get(k) for k in ('enabled', 'ok', 'wall_s', 'imports_s', 'error')})}")
for name, c in (r.get("jit_compiled") or {}).items():
    print(f"    compiled {name}: {c['compiled']} new, busy {c['busy_s']} s: {[m['module'] for m in c['modules'][:12]]}")
PYEOF
  fi
  tar -C "$RUNS_DIR" -czf "$OUT/logs-$phase.tar.gz" $(cd "$RUNS_DIR" && ls -d ./*/logs ./*/smoke.out 2>/dev/null)
  return $rc
}

build_args=()
if [ "$phase" = triton ]; then
  REC=/tmp/i21/triton-record.jsonl
  rm -rf "$K" "$RUNS_DIR" "$REC"
  smoke_fresh record DFLASH_TRITON_RECORD="$REC"
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
    smoke_fresh "prebuilt$i" DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
    if [ -d "$K/triton" ] && [ "$i" = 1 ]; then
      smoke_fresh no-triton-layer DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 \
        TRITON_CACHE_MANAGER=triton.runtime.cache:FileCacheManager
    fi
  done
  # Where the imports go (Python's own -X importtime, every SGLang process): last, it slows the run.
  [ -n "${IMPORTTIME:-}" ] && smoke_fresh importtime DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 \
    PYTHONPROFILEIMPORTTIME=1
else
  CUTE_CACHE=/tmp/i21/cute-cache
  rm -rf "$CUTE_CACHE"
  $PY -c "import cutlass, cutlass.cute; from importlib.metadata import version; print('cutlass-dsl', version('nvidia-cutlass-dsl'))" >>"$summary" 2>&1
  CUTE_CACHE=$CUTE_CACHE smoke_fresh cute1 DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_USE_CUDA_NORM=0 \
    FLASHINFER_DISABLE_JIT=1 CUTE_DSL_CACHE_DIR="$CUTE_CACHE"
  smoke_fresh aot-with-cutlass DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
  CUTE_CACHE=$CUTE_CACHE smoke_fresh cute2-cache-kept DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_USE_CUDA_NORM=0 \
    FLASHINFER_DISABLE_JIT=1 CUTE_DSL_CACHE_DIR="$CUTE_CACHE"
fi
stamp "done"
cat "$summary"
