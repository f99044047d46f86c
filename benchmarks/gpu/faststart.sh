#!/usr/bin/env bash
# The fast start on the H200 with Nix conditions (issue 44): is it safe, and does it save time?
# fastStart became on by default for tpSize 1 once this showed both (call 10, the H200). Steps ($STEPS, default all, in this order):
#   setup   byte code as a Nix build writes it (compileall, checked-hash) over the payload and the
#           device's site-packages, then `prebuilt_kernels.sh build` (the flake's prebuilt kernels,
#           /tmp/i21/prebuilt; kept while the machine stays warm)
#   imports the server's first import (`import sglang.launch_server` in a fresh interpreter) with the
#           Nix stack's import fix-ups (common.sh's stack_fixups, the scripts prepare_fixups.sh writes)
#           and as published, alternating, $IMPORT_RUNS (3) each
#   cudasites  benchmarks/gpu/cuda_at_import.py: where SGLang's own modules (what a scheduler and a
#           detokenizer import) and the GPU libraries reach CUDA at import, site by site (what a template
#           preloading them would have to answer without CUDA); cudasites.json, about a minute
#   doctor  doctor's faststart line: the stack's interpreter runs a template over SGLang 0.5.11's
#           list and forks one child through it (which entries it left out, the forked test child's cuInit)
#   nccl    NCCL in a forked child: a template preloading that list, one child forked from it that
#           initialises CUDA and a torch.distributed NCCL group of one (tp 1) and all-reduces on GPU 0
#   death   benchmarks/gpu/faststart_death.py: one real DFLASH instance under `dflashctl serve` with the
#           fast start, its scheduler SIGKILLed once ready: serve's exit code and seconds, processes left
#   smokes  fresh default smokes ($RUNS, default "on1 off1 on2 off2 on3 off3", alternating; a label
#           starting with "on" adds --fast-start): each server's ready time and start-up phases, the
#           template's lines (forked / spawned and why / entries left out), start to table, outputs
#           12/12 (lossless), the oracle speed-up; then a table with the medians with and without.
#           A label starting with "default" passes neither flag (the setting's default: on at tp 1).
#           A label starting with "own": the fast start with SGLang's own modules preloaded too
#           ($OWN_ENTRIES after the shipped list; the template answers the compute capability from NVML);
#           OWN=1 gives the nccl and death steps that list too
# One device call runs at most 9 minutes (BUDGET=540 s; each smoke at most 170 s or what is left,
# common.sh's fresh_smoke, skipped below 50 s). Everything needs about two calls, e.g. with carry
# [".gpu"]:   bash benchmarks/gpu/faststart.sh
#             STEPS=smokes RUNS="off2 on3 off3" bash benchmarks/gpu/faststart.sh   (what the first skipped)
# Writes into $OUT (default ./faststart-out): summary.txt, <label>.json per smoke, doctor.json,
# cudasites.txt and .json, nccl.txt, faststart-death.json and its serve log, logs.tar.gz (every server's log and smoke's output).
# Six smokes make more than the 8 files a device call brings back: pack $OUT into one tar.gz there.
set -uo pipefail
OUT=${OUT:-$PWD/faststart-out}
mkdir -p "$OUT" /tmp/i21 /tmp/i44
summary="$OUT/summary.txt"
PY=${PYTHON:-python3}
K=/tmp/i21/prebuilt
RUNS_DIR=/tmp/i44/runs
LOGS_TAR=$OUT/logs.tar.gz
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH="$REPO/python:$PYTHONPATH"
rm -rf "$RUNS_DIR"; mkdir -p "$RUNS_DIR"
{
  machine_facts sglang sglang-kernel torch triton transformers
  echo "== timeline (seconds since the script started)"
} >"$summary"

STEPS=${STEPS:-setup imports cudasites doctor nccl death smokes}
RUNS=${RUNS:-on1 off1 on2 off2 on3 off3}
want() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

# 1. Nix conditions
if want setup; then
SYSTEM_SITE=$($PY -c "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('torch').origin)))")
s=$(ms)
$PY -m compileall -q -j0 --invalidation-mode checked-hash "$SITE" >/dev/null 2>&1
$PY -m compileall -q -j0 --invalidation-mode checked-hash "$SYSTEM_SITE" >/dev/null 2>&1
stamp "compileall (checked-hash) $SITE and $SYSTEM_SITE: $(secs_since "$s")s"
if [ ! -f "$K/index.json" ]; then
  BUDGET=$(( $(left) - 5 )) RUNS=0 OUT=$OUT/build bash "$(dirname "$0")/prebuilt_kernels.sh" build >/dev/null 2>&1
  [ -f "$K/index.json" ] && rm -rf "$OUT/build"  # kept where the build failed: its summary says why
fi
fi
[ -f "$K/index.json" ] && stamp "prebuilt kernels: $K" || stamp "no prebuilt kernels: the runs compile (say so)"

# 1b. the first import with the Nix stack's import fix-ups (sglang: IPython and the frontend language
# made lazy; transformers: torchao) and as published: a fresh interpreter importing the server's main
# module, alternating, $IMPORT_RUNS (3) of each after one unmeasured; the fixed files stay afterwards
if want imports; then
if [ -s "$SITE/.fixups-edited" ]; then
  mapfile -t EDITED <"$SITE/.fixups-edited"
  for f in "${EDITED[@]}"; do cp "$f" "$f.fixed"; done
  probe='import sys, time; t = time.perf_counter(); import sglang.launch_server; d = time.perf_counter() - t; print(round(d, 2), "s, imported:", {m: m in sys.modules for m in ("IPython", "sglang.lang", "aiohttp", "torchao")}, len(sys.modules), "modules")'
  $PY -c "$probe" >/dev/null 2>&1
  for i in $(seq "${IMPORT_RUNS:-3}"); do
    for variant in orig fixed; do
      for f in "${EDITED[@]}"; do cp "$f.$variant" "$f"; done
      stamp "import sglang.launch_server, $variant: $($PY -c "$probe" 2>&1 | tail -n1)"
    done
  done
  for f in "${EDITED[@]}"; do cp "$f.fixed" "$f"; done
else
  stamp "imports: skipped, no fix-up was applied (no $SITE/.fixups-edited: prepare_fixups.sh)"
fi
fi

# 1c. where SGLang's own modules reach CUDA at import (each call goes on to the driver: a diagnostic)
if want cudasites; then
s=$(ms)
timeout 300 $PY benchmarks/gpu/cuda_at_import.py --json "$OUT/cudasites.json" >"$OUT/cudasites.txt" 2>&1
stamp "cudasites: exit $? after $(secs_since "$s")s"
cut -c1-300 "$OUT/cudasites.txt" | sed 's/^/    /' >>"$summary"
fi

# the "own" list (smokes labelled own*; nccl and death with OWN=1): the fast start with the shipped list and SGLang's own modules after it
# ($OWN_ENTRIES), the compute capability answered from NVML while the template imports them
SHIPPED_LIST=$REPO/python/dflashctl/host/data/sglang-0.5.11-preload.json
OWN_LIST=/tmp/i44/preload-own.json
$PY - "$SHIPPED_LIST" "$OWN_LIST" \
  ${OWN_ENTRIES:-sglang.srt.managers.detokenizer_manager sglang.srt.managers.scheduler sglang.srt.models.registry} <<'PYEOF'
import json, sys
shipped, out, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
json.dump({"preload": json.load(open(shipped))["preload"] + extra}, open(out, "w"), indent=1)
PYEOF
STEP_LIST=$SHIPPED_LIST; [ "${OWN:-0}" = 1 ] && STEP_LIST=$OWN_LIST
stamp "nccl and death preload $STEP_LIST"

# 2. doctor
if want doctor; then
$PY -m dflashctl doctor --json >"$OUT/doctor.json" 2>/dev/null
stamp "doctor: $($PY -c "import json, sys; c = [c for c in json.load(open(sys.argv[1]))['checks'] if c['name'] in ('faststart', 'bytecode')]; print(' | '.join(f\"{x['name']} {x['status']} {x['summary']}\" for x in c))" "$OUT/doctor.json" 2>&1 | tail -n1)"
fi

# 3. NCCL (tp 1) in a child forked from a template that preloaded SGLang's list
if want nccl; then
HOOK=$REPO/python/dflashctl/host/kernel_hook
cat >/tmp/i44/nccl_child.py <<'PYEOF'
import multiprocessing as mp, os, time

def child(writer):
    import torch, torch.distributed as dist
    t = time.monotonic()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29544", rank=0, world_size=1)
    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    writer.send({"ppid": os.getppid(), "sum": x.sum().item(), "nccl": torch.cuda.nccl.version(),
                 "init_s": round(time.monotonic() - t, 2)})
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch  # the server imports torch (and initialises CUDA) before its children start
    torch.cuda.is_available()
    mp.set_start_method("spawn", force=True)
    r, w = mp.Pipe(duplex=False)
    p = mp.Process(target=child, args=(w,), name="scheduler_0")
    p.start()
    print("child said", r.recv() if r.poll(120) else "nothing", "; server pid", os.getpid(), flush=True)
    p.join(60)
    print("child exit", p.exitcode, type(p._popen).__name__, flush=True)
PYEOF
s=$(ms)
( cd /tmp/i44 && PYTHONPATH=$HOOK:$PYTHONPATH DFLASH_FASTSTART=$STEP_LIST timeout 150 $PY nccl_child.py ) >"$OUT/nccl.txt" 2>&1
stamp "nccl (tp 1) in a forked child: exit $? after $(secs_since "$s")s: $(grep -E 'child said|child exit|faststart\] (scheduler|template)' "$OUT/nccl.txt" | cut -c1-220 | tr '\n' ' ')"
fi

# 4. a child's death seen by serve, with the fast start
if want death; then
  limit=$(( $(left) - 5 )); [ "$limit" -gt 150 ] && limit=150
  if [ "$limit" -lt 60 ]; then
    stamp "death: skipped, ${limit}s left"
  else
    s=$(ms)
    kernels=(); [ -f "$K/index.json" ] && [ -f "$K/flashinfer-aot/dflash-prebuilt.json" ] \
      && kernels=(DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1)
    env "${kernels[@]}" DFLASH_FASTSTART="$STEP_LIST" timeout --signal=INT --kill-after=20 "$limit" $PY benchmarks/gpu/faststart_death.py \
      --out "$OUT" --fast-start --python "$(command -v $PY)" >"$OUT/death.txt" 2>&1
    stamp "death: exit $? after $(secs_since "$s")s: $(tail -n1 "$OUT/death.txt" | cut -c1-400)"
    grep -h 'dflash faststart' "$OUT/faststart-death-sglang.log" 2>/dev/null | sed 's/(pid [0-9]*)//' | cut -c1-300 \
      | sed 's/^/    /' >>"$summary"
  fi
fi

# 5. fresh default smokes: with the prebuilt kernels only where their build finished (flashinfer's
# record there too), else JIT allowed; FLASHINFER_DISABLE_JIT over a partial build fails every capture
want smokes || RUNS=""
kernels=(); [ -f "$K/index.json" ] && [ -f "$K/flashinfer-aot/dflash-prebuilt.json" ] \
  && kernels=(DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1)
stamp "smokes: ${kernels[*]:-no prebuilt kernels, JIT compiles at each fresh start}"
for label in $RUNS; do
  flag=(--no-fast-start); own=()
  [ "${label#on}" != "$label" ] && flag=(--fast-start)
  [ "${label#own}" != "$label" ] && flag=(--fast-start) && own=(DFLASH_FASTSTART="$OWN_LIST")
  [ "${label#default}" != "$label" ] && flag=()
  fresh_smoke "$label" "${kernels[@]}" "${own[@]}" -- "${flag[@]}" "$@"
  cat "$RUNS_DIR/$label"/logs/*.log 2>/dev/null | grep -ho '\[dflash faststart\].*' | sed 's/(pid [0-9]*)//' \
    | sort | uniq -c | cut -c1-300 | sed 's/^/    /' >>"$summary"
done

# 6. the table
[ -n "$RUNS" ] && $PY - "$OUT" $RUNS >>"$summary" 2>&1 <<'PYEOF'
import json, os, statistics, sys
out, labels = sys.argv[1], sys.argv[2:]
print("== per run: start to table; per server: ready s (imports / scheduler start) and how its children started")
ready = {"on": [], "off": [], "own": [], "default": []}
for label in labels:
    path = os.path.join(out, f"{label}.json")
    if not os.path.exists(path):
        print(f"{label}: no result")
        continue
    r = json.load(open(path))
    runs = r.get("runs", [])
    speed = next((x["phases"]["sequential"].get("speedup") for x in runs
                  if x["name"] == "DFLASH" and isinstance(x.get("phases"), dict)), None)
    print(f"{label}: ok {r['ok']}, start to table {r.get('phases_s', {}).get('start to table')} s, DFLASH x {speed}")
    for x in runs:
        st = x.get("startup") or {}
        sec = st.get("seconds") or {}
        fs = st.get("faststart") or {}
        ready[next(k for k in ("on", "own", "default", "off") if label.startswith(k) or k == "off")].append(x.get("startup_s"))
        print(f"    {x['name']:16} ready {x.get('startup_s')} s (imports {sec.get('imports')}, scheduler start "
              f"{sec.get('scheduler_start')}); template {fs.get('template_s')} s, forked {fs.get('forked')}, "
              f"spawned {fs.get('spawned')}, left out {fs.get('left_out')}, unusable {fs.get('unusable')}; "
              f"lossless {(x.get('lossless') or {}).get('status')}")
for k, v in ready.items():
    v = [t for t in v if t is not None]
    if v:
        print(f"ready per server, fast start {k}: median {statistics.median(v):.1f} s, max {max(v):.1f} s over {len(v)} servers")
PYEOF
stamp "done"
cat "$summary"
