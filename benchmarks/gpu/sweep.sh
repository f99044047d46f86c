#!/usr/bin/env bash
# Where DFLASH stops paying as load grows (issue 36): `dflashctl smoke --sweep` on the one H200 with
# the oracle pair: the baseline, DFLASH with the oracle drafter and DFLASH with the poisoned drafter,
# side by side on the GPU, each measured once all are ready (--wait-all: a quiet GPU and CPU for
# every point), at 1, 2, 4, 8, 16, 32 and 64 requests in flight, 256 new tokens each, one round of
# C requests per point (at least the 8 prompts once); no grammar server (it has no sweep).
#
# Device command, from the repository root, with the stack's payload carried as .gpu (benchmarks/README.md;
# it unpacks once per machine):
#     bash benchmarks/gpu/sweep.sh
# Expected: about 75-90 s after the payload is unpacked on a fresh H200 (byte code 12-15 s, servers
# ready after 45-60 s, the sweep itself 10-15 s); hard stop at SWEEP_BUDGET (110) seconds. Faster
# where an earlier script of the same call left byte code, warm JIT caches in $HOME or
# DFLASH_PREBUILT_KERNELS set (all three are used as found).
#
# Steps:
#   1. byte code for the payload and the device's site-packages, as a pip or Nix install has it
#      (python -m compileall; the device image has none and sets PYTHONDONTWRITEBYTECODE): skipped
#      when SGLang's already has it, or with BYTECODE=0. It halves every server's imports
#      (docs/benchmarks.md, "Byte code").
#   2. the smoke, DFLASH_TRITON_RECORD on (the Triton kernels of the larger batches, for a later
#      prebuilt build), within what is left of the budget.
#   3. the sweep table and each server's start-up into summary.txt.
# Knobs: SWEEP_POINTS (1,2,4,8,16,32,64; 1,4,16,64 takes a few seconds less), SWEEP_ROUNDS (1),
# SWEEP_NEW_TOKENS (256), SWEEP_BUDGET;
# SITE (/tmp/site, the unpacked payload) and WORK (/tmp/i36: models, logs) for a dry run elsewhere.
# Writes into $OUT: summary.txt, sweep-h200.json (the smoke's result), sweep-h200.txt (its output),
# triton-sweep-sm90.jsonl, sweep-logs.tar.gz (each server's SGLang log).
# Then, where matplotlib is installed:
#     python benchmarks/sweep_plot.py OUT/sweep-h200.json --out docs/gpu/sweep-h200/sweep-h200.png
set -uo pipefail
OUT=${OUT:-$PWD/sweep-out}
mkdir -p "$OUT"
BUDGET=${SWEEP_BUDGET:-110}
summary="$OUT/summary.txt"
PY=${PYTHON:-python3}
: >"$summary"
source "$(dirname "$0")/common.sh"
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/i36}
stack_setup || exit 3
export PYTHONPATH=$PWD/python:$SITE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$WORK/sweep" "$WORK/sweep-logs"; mkdir -p "$WORK"
POINTS=${SWEEP_POINTS:-1,2,4,8,16,32,64}
stamp "sweep: $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -1)"
stamp "GPU processes already there: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1 | tr '\n' ';')"

compile_bytecode
stamp "prebuilt kernels: ${DFLASH_PREBUILT_KERNELS:-none}; tvm-ffi cache in HOME: $(ls "${XDG_CACHE_HOME:-$HOME/.cache}/dflashctl/jit/tvm-ffi" 2>/dev/null | wc -l) entries"

secs=$(( $(left) - 5 ))
if [ "$secs" -lt 30 ]; then stamp "smoke skipped: ${secs}s left"; exit 4; fi
stamp "smoke --sweep $POINTS: start, limit ${secs}s"
s=$(ms)
DFLASH_TRITON_RECORD=$OUT/triton-sweep-sm90.jsonl timeout --signal=TERM --kill-after=10 "$secs" \
  $PY -m dflashctl smoke --sweep "$POINTS" --sweep-rounds "${SWEEP_ROUNDS:-1}" \
  --max-new-tokens "${SWEEP_NEW_TOKENS:-256}" --no-grammar --wait-all \
  --work-dir "$WORK/sweep" --keep-logs "$WORK/sweep-logs" --json "$OUT/sweep-h200.json" \
  >"$OUT/sweep-h200.txt" 2>&1
rc=$?
stamp "smoke: exit $rc after $(secs_since "$s")s"
tar -C "$WORK" -czf "$OUT/sweep-logs.tar.gz" sweep-logs 2>/dev/null
[ -f "$OUT/sweep-h200.json" ] && $PY - "$OUT/sweep-h200.json" 2>&1 <<'PYEOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
p = r.get("phases_s", {})
print(f"ok {r['ok']}, start to table {p.get('start to table')} s; failures: {r.get('failures')}")
for x in r.get("runs", []):
    print(f"  {x['name']}: ready {x['startup_s']} s, start-up {(x.get('startup') or {}).get('seconds')}")
    same = x.get("lossless") or {}
    lossless = f"lossless {same['status']} {same.get('identical')}/{same.get('compared')}; " if same else ""
    info = x["server_info"]
    print(f"    {lossless}server max_running_requests {info.get('max_running_requests')}, "
          f"cuda_graph_bs {info.get('cuda_graph_bs')}")
s = r.get("sweep")
if s:
    print("point  " + "  ".join(f"{run['name']:>24}" for run in s["runs"]))
    for i, c in enumerate(s["points"]):
        cells = []
        for run in s["runs"]:
            pt = run["points"][i] if i < len(run["points"]) else {}
            sp = f" {pt['speedup']:.2f}x" if pt.get("speedup") else ""
            acc = f" a{pt['accept_length']:.2f}" if pt.get("accept_length") else ""
            cells.append(f"{pt.get('output_tok_s', 0) or 0:9.0f}{sp}{acc}")
        print(f"{c:5d}  " + "  ".join(f"{cell:>24}" for cell in cells))
    for run in s["runs"]:
        for line in [run.get("line")] + [f"note: {n}" for n in run["server_limits"]]:
            if line:
                print("  " + line)
PYEOF
rec=$OUT/triton-sweep-sm90.jsonl
stamp "triton kernels recorded: $([ -f "$rec" ] && wc -l <"$rec" || echo 0) requests"
exit $rc
