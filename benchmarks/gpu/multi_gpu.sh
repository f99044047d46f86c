#!/usr/bin/env bash
# A host's worth of instances (issue 36): one DFLASH instance per GPU (the smoke's oracle pair),
# each its own `dflashctl serve` with gpus [i] (CUDA_VISIBLE_DEVICES=i, as the module's
# `services.dflash.instances.gpuI.gpus = [ i ]` renders it), sglang-router 0.3.2 in front as its
# unit runs it, then under load: a kill -9 of one instance, its restart and re-admission
# (benchmarks/router_bench.py), or an upgrade of all of them, rolling against all at once
# (benchmarks/rollout_bench.py: `dflashctl rollout`).
#
# Needs several GPUs of one host: kind nvidia-h200-x4 or nvidia-h200-x8 (N = every GPU the
# machine shows; GPUS=N uses fewer). Not run yet: no multi-GPU machine was lent in issue 36's
# session. The stack's payload (.gpu) and the router's (.gpu-router, see benchmarks/gpu/rollout.sh
# for how to make it) do not fit one transfer, so calls on one warm machine, one part per call
# (each within the 10-minute limit; PART_BUDGET, default 560 s):
#   1. carry [".gpu"]:         source .gpu/setup.sh
#   2. carry [".gpu-router"]:  source .gpu/setup.sh && bash benchmarks/gpu/multi_gpu.sh router
#   3. (same machine)           source .gpu/setup.sh && bash benchmarks/gpu/multi_gpu.sh rolling
#   4. (same machine)           source .gpu/setup.sh && bash benchmarks/gpu/multi_gpu.sh all
# Expected per part on 8 GPUs: byte code 15 s (first call only), the N instances started together
# 60-120 s, then router: 90 s of load with the kill at 20 s; rolling: about 40 s per instance;
# all: one restart of everything (about 60-90 s).
# Knobs: GPUS, CLIENTS (default 4 per instance), ROUTER_MINUTES (1.5), ROUTER_KILL_AT (20).
# Writes into $OUT: summary.txt, units/ (each instance's settings and `dflashctl unit` of it),
# PART.txt (the bench's tables), PART.json, PART-logs.txt (key lines of every log).
set -uo pipefail
PART=${1:-router}
case "$PART" in router | rolling | all) ;; *) echo "usage: multi_gpu.sh router|rolling|all" >&2; exit 2 ;; esac
OUT=${OUT:-$PWD/multi-gpu-out}
mkdir -p "$OUT/units"
BUDGET=${PART_BUDGET:-560}
summary="$OUT/summary.txt"
PY=${PYTHON:-python3}
source "$(dirname "$0")/common.sh"
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/i36-multi}
ROUTER_SITE=${ROUTER_SITE:-/tmp/router-site}
[ -f "$SITE/.unpacked" ] || { stamp "no $SITE: source .gpu/setup.sh first (see the header)"; exit 3; }
if [ ! -f "$ROUTER_SITE/.unpacked" ]; then
  [ -f .gpu-router/router.tar.xz ] || { stamp "no $ROUTER_SITE and no .gpu-router/router.tar.xz: carry it"; exit 3; }
  mkdir -p "$ROUTER_SITE" && xz -d -T4 <.gpu-router/router.tar.xz | tar -x -C "$ROUTER_SITE" && touch "$ROUTER_SITE/.unpacked"
fi
export PYTHONPATH=$PWD/python:$SITE:$ROUTER_SITE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
N=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
CLIENTS=${CLIENTS:-$((4 * N))}
stamp "multi-gpu $PART: $(nproc) cores, $N GPU(s) used of $(nvidia-smi -L 2>/dev/null | wc -l): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | sort | uniq -c | tr -s ' \n' ' ')"
[ "$N" -ge 2 ] || { stamp "needs at least 2 GPUs: run it on kind nvidia-h200-x4 or -x8"; exit 5; }
if [ "${BYTECODE:-1}" = 1 ] && [ -z "$(find "$SITE/sglang" -name '*.pyc' 2>/dev/null | head -n 1)" ]; then
  s=$(ms)
  site=$($PY -c "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.dirname(os.path.dirname(s.origin)) if s else '')")
  $PY -m compileall -q -j0 "$SITE" ${site:+"$site"} >/dev/null 2>&1
  stamp "byte code: $(secs_since "$s")s"
fi

# One settings file per GPU, the keys of services.dflash.instances.<name>; one JIT cache for all
# (the first start compiles once, the others find it), each its own port and GPU.
mkdir -p "$WORK"
$PY - "$WORK" "$N" <<'PY'
import json, sys
from pathlib import Path
from dflashctl.smoke import oracle
from dflashctl.smoke.smoke import ORACLE_KV_TOKENS
work, n = Path(sys.argv[1]), int(sys.argv[2])
pair = oracle.write_pair(work / "models")
for i in range(n):
    settings = {"name": f"gpu{i}", "model": str(pair.target), "draftModel": str(pair.draft), "port": 31000 + i,
                "gpus": [i], "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
                "attentionBackend": "triton", "samplingBackend": "pytorch", "skipTokenizerInit": True,
                "grammarBackend": "none", "memFractionStatic": 0.5, "cudaGraphMaxBs": 8, "enableMetrics": True,
                "startTimeoutSec": 600, "cacheDir": str(work / "cache"),
                "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(ORACLE_KV_TOKENS)]}
    (work / f"gpu{i}.json").write_text(json.dumps(settings, indent=2))
PY
mkdir -p "$WORK/bin"  # the unit names an absolute dflashctl; here it runs from PYTHONPATH
printf '#!/bin/sh\nexec %s -m dflashctl "$@"\n' "$(command -v $PY)" >"$WORK/bin/dflashctl" && chmod +x "$WORK/bin/dflashctl"
for ((i = 0; i < N; i++)); do  # as a host installs them: the unit's own CacheDirectory, not the shared one
  $PY -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("cacheDir"); json.dump(d, open(sys.argv[2], "w"), indent=2)' \
    "$WORK/gpu$i.json" "$OUT/units/gpu$i.json"
  $PY -m dflashctl unit --config "$OUT/units/gpu$i.json" --dflashctl "$WORK/bin/dflashctl" --python "$(command -v $PY)" \
    -o "$OUT/units/dflash-gpu$i.service" >>"$summary" 2>&1 || stamp "unit of gpu$i: not rendered (see above)"
done
stamp "settings and units: $(ls "$OUT/units" | tr '\n' ' ')"
instances=()
for ((i = 0; i < N; i++)); do instances+=(--instance "$WORK/gpu$i.json"); done

secs=$(( $(left) - 20 ))
stamp "$PART: start, limit ${secs}s, $CLIENTS clients"
s=$(ms)
if [ "$PART" = router ]; then
  timeout --signal=INT --kill-after=30 "$secs" $PY benchmarks/router_bench.py "${instances[@]}" --start-together \
    --victim "gpu$((N - 1))" --python "$(command -v $PY)" --router-python "$(command -v $PY)" --clients "$CLIENTS" \
    --minutes "${ROUTER_MINUTES:-1.5}" --kill-at "${ROUTER_KILL_AT:-20}" --start-timeout 400 \
    --json "$OUT/$PART.json" --work-dir "$WORK/bench-$PART" >"$OUT/$PART.txt" 2>&1
else
  timeout --signal=INT --kill-after=30 "$secs" $PY benchmarks/rollout_bench.py "${instances[@]}" --start-together \
    --mode "$PART" --python "$(command -v $PY)" --clients "$CLIENTS" --before 10 --after 10 --healthy-for 5 \
    --start-timeout 400 --json "$OUT/$PART.json" --work-dir "$WORK/bench-$PART" >"$OUT/$PART.txt" 2>&1
fi
rc=$?
stamp "$PART: exit $rc after $(secs_since "$s")s"
{ nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>&1
  for f in "$WORK/bench-$PART"/serve-*.log "$WORK/bench-$PART"/router.log; do
    [ -e "$f" ] || continue
    echo "===== $f (key lines)"
    grep -E "CUDA_VISIBLE_DEVICES|KV Cache|max_total_num_tokens|Not enough|ready|READY|exit|Traceback|Error|preflight" "$f" \
      | cut -c1-300 | head -30
    echo "===== $f (last 10 lines)"; tail -n 10 "$f" | cut -c1-300
  done
} >"$OUT/$PART-logs.txt" 2>&1
tail -n 40 "$OUT/$PART.txt" | tee -a "$summary"
exit $rc
