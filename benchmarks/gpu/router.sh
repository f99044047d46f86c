#!/usr/bin/env bash
# Two real SGLang 0.5.11 instances (synthetic DFLASH pair) on the one H200 behind sglang-router 0.3.2,
# eight clients, kill -9 of one instance under load and its restart: benchmarks/router_bench.py.
#
# The stack's payload (.gpu, ~60 MiB) and the router's (.gpu-router, ~18 MiB: the sglang_router
# package unpacked from the wheel nix/router-lock.json pins) do not fit one transfer, so two calls
# on one warm machine (it keeps /tmp for ~30 s between them):
#   1. carry [".gpu"]:         source benchmarks/gpu/setup.sh
#   2. carry [".gpu-router"]:  bash benchmarks/gpu/router.sh
# Make .gpu-router with:  mkdir -p .gpu-router /tmp/rs && (cd /tmp/rs && unzip -q WHEEL) &&
#                         tar -C /tmp/rs -cf - . | xz -T2 -9 > .gpu-router/router.tar.xz
#
# Instances: x (memFractionStatic 0.2) is started first, y (0.5) once x answers; y is the one
# killed, so its restart meets x's memory, as SGLang's pool rule allows (docs/service.md). CUDA
# graphs off (the faults matter here, not the speed). The router runs from the stack's interpreter
# with the router package on PYTHONPATH (on a host it has its own environment).
# Writes into $OUT: router-h200.txt (table), router-h200.json, router-h200-logs.txt.
set -uo pipefail
OUT=${OUT:-/tmp/router-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 1
router_setup || exit 1
export PYTHONPATH=$PWD/python:/tmp/router-site${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d)
python3 - "$work" <<'PY'
import json, sys
from pathlib import Path
from dflashctl.smoke import synthetic
work = Path(sys.argv[1])
target, draft = synthetic.write_pair(work / "models")
for name, port, fraction in (("x", 31000, 0.2), ("y", 31001, 0.5)):
    settings = {"name": name, "model": str(target), "draftModel": str(draft), "port": port,
                "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
                "gpus": [0], "allowSharedGpus": True, "attentionBackend": "triton",
                "samplingBackend": "pytorch", "loadFormat": "dummy", "draftLoadFormat": "dummy",
                "skipTokenizerInit": True, "grammarBackend": "none", "memFractionStatic": fraction,
                "disableCudaGraph": True, "extraArgs": ["--disable-piecewise-cuda-graph"],
                "startTimeoutSec": 300, "cacheDir": str(work / "cache")}
    (work / f"{name}.json").write_text(json.dumps(settings, indent=2))
PY
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import sglang_router, importlib.metadata as m; print('sglang', m.version('sglang'), '| sglang-router', sglang_router.__version__)"
} >"$OUT/router-h200.txt" 2>&1
timeout --signal=INT 480 python3 benchmarks/router_bench.py --instance "$work/x.json" --instance "$work/y.json" \
  --victim y --python "$(command -v python3)" --router-python "$(command -v python3)" --clients 8 --minutes "${ROUTER_MINUTES:-1.5}" \
  --kill-at "${ROUTER_KILL_AT:-20}" --start-timeout 300 --json "$OUT/router-h200.json" --work-dir "$work/bench" \
  >>"$OUT/router-h200.txt" 2>&1
echo "router_bench exit $?" >>"$OUT/router-h200.txt"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >>"$OUT/router-h200.txt" 2>&1
for f in "$work"/bench/serve-*.log "$work"/bench/dflash-*-sglang.log* "$work"/bench/router.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "KV Cache|max_total_num_tokens|Not enough|memory|ready|READY|exit|Traceback|Error|preflight|gpu-memory" "$f" | cut -c1-300 | head -60
    echo "===== $f (last 30 lines)"; tail -n 30 "$f" | cut -c1-300; } >>"$OUT/router-h200-logs.txt"
done
cat "$OUT/router-h200.txt"
