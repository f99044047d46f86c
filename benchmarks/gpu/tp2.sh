#!/usr/bin/env bash
# Tensor parallelism (issue 36): every smoke server on two GPUs (gpus [0 1], tpSize 2, as the
# module's `gpus = [ 0 1 ]; tpSize = 2;` renders them) with the oracle pair, lossless against plain
# decoding at TP=2 and against TP=1, and what NCCL opened meanwhile, held to the unit's DeviceAllow.
#
# Needs two GPUs of one host: kind nvidia-h200-x2 (or larger; NVLink between them on an HGX host).
# Not run yet: no multi-GPU machine was lent in issue 36's session. Device command, from the
# repository root, with the stack's payload carried as .gpu:
#     source .gpu/setup.sh && bash benchmarks/gpu/tp2.sh
# About 4-6 min on a fresh machine (byte code, two smokes), within TP2_BUDGET (540) seconds.
#
#   1. the machine: nvidia-smi topo -m (NVLink or PCIe between GPU0 and GPU1), NCCL's version,
#      /dev/shm's size; byte code for the payload (as benchmarks/gpu/sweep.sh)
#   2. `smoke --tp-size 2 --no-grammar`: baseline, DFLASH (oracle drafter), DFLASH-poisoned, each
#      on GPUs 0 and 1, NCCL_DEBUG=INFO (init, transports) in each server's log; the smoke holds the
#      baseline to the pair's rule, each speculative run to the baseline request by request and to
#      its acceptance band. nccl_devices.py samples every SGLang process's open devices, /dev/shm
#      files and sockets meanwhile.
#   3. `smoke --runs baseline,DFLASH --no-grammar` at TP=1 on GPU 0, recorded too; then every
#      request's output ids at TP=2 against TP=1 (the same prompts, seeds and lengths).
# Under the unit's sandbox itself this needs systemd, which the lent machines lack: on a systemd
# host, `dflashctl unit --config OUT/tp2-instance.json` is the unit to start (the settings are
# written in step 2); here the device list NCCL used is resolved against the same DeviceAllow.
# Writes into $OUT: summary.txt, topo.txt, tp2.json, tp2.txt, tp1.json, tp1.txt, tp2-devices.json,
# tp2-instance.json, tp2-vs-tp1.json, logs-tp.tar.gz (each server's log, NCCL's lines in them).
set -uo pipefail
OUT=${OUT:-$PWD/tp2-out}
mkdir -p "$OUT"
BUDGET=${TP2_BUDGET:-540}
summary="$OUT/summary.txt"
PY=${PYTHON:-python3}
: >"$summary"
source "$(dirname "$0")/common.sh"
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/i36-tp}
[ -f "$SITE/.unpacked" ] || { stamp "no $SITE: source .gpu/setup.sh first (see the header)"; exit 3; }
export PYTHONPATH=$PWD/python:$SITE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$WORK"; mkdir -p "$WORK"
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}  # GPUS: for a dry run without nvidia-smi
stamp "tp2: $(nproc) cores, $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
[ "$gpus" -ge 2 ] || { stamp "needs 2 GPUs, found $gpus: run it on kind nvidia-h200-x2"; exit 5; }
{ nvidia-smi topo -m; echo; df -h /dev/shm; echo
  $PY -c "import torch; print('torch', torch.__version__, 'NCCL', '.'.join(map(str, torch.cuda.nccl.version())))"
} >"$OUT/topo.txt" 2>&1
stamp "GPU0-GPU1 link: $(nvidia-smi topo -m 2>/dev/null | awk '$1 == "GPU0" {print $3}'); $(tail -n 1 "$OUT/topo.txt")"
if [ "${BYTECODE:-1}" = 1 ] && [ -z "$(find "$SITE/sglang" -name '*.pyc' 2>/dev/null | head -n 1)" ]; then
  s=$(ms)
  site=$($PY -c "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.dirname(os.path.dirname(s.origin)) if s else '')")
  $PY -m compileall -q -j0 "$SITE" ${site:+"$site"} >/dev/null 2>&1
  stamp "byte code: $(secs_since "$s")s"
fi

# smoke LABEL ARGS...: one smoke, within what is left (at most 240 s), its result and output kept.
smoke() {
  local label=$1; shift
  local secs; secs=$(( $(left) - 10 )); [ "$secs" -gt 240 ] && secs=240
  if [ "$secs" -lt 60 ]; then stamp "$label: skipped, ${secs}s left"; return 1; fi
  stamp "$label: start ($*), limit ${secs}s"
  local s rc; s=$(ms)
  timeout --signal=TERM --kill-after=15 "$secs" $PY -m dflashctl smoke --no-grammar --wait-all \
    --work-dir "$WORK/$label" --keep-logs "$WORK/logs/$label" --record "$WORK/rec-$label" \
    --json "$OUT/$label.json" "$@" >"$OUT/$label.txt" 2>&1
  rc=$?
  stamp "$label: exit $rc after $(secs_since "$s")s"
  grep -A6 '^run ' "$OUT/$label.txt" | tee -a "$summary"
  return $rc
}

$PY benchmarks/gpu/nccl_devices.py --match sglang --seconds 300 --json "$OUT/tp2-devices.json" \
  >>"$summary" 2>&1 &
watcher=$!
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET smoke tp2 --tp-size 2
kill -TERM "$watcher" 2>/dev/null; wait "$watcher"
# the settings the TP=2 DFLASH server ran with, as an instance JSON `dflashctl unit` reads
$PY - "$OUT/tp2.json" "$OUT/tp2-instance.json" <<'PYEOF' 2>>"$summary"
import json, sys
r = json.load(open(sys.argv[1]))
info = next((x["server_info"] for x in r.get("runs", []) if x["name"] == "DFLASH"), {})
json.dump({"name": "tp2", "model": info.get("model_path"), "draftModel": info.get("speculative_draft_model_path"),
           "gpus": [0, 1], "tpSize": 2, "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16},
           "attentionBackend": "triton", "skipTokenizerInit": True, "grammarBackend": "none",
           "extraArgs": ["--max-total-tokens", "32768"]}, open(sys.argv[2], "w"), indent=2)
PYEOF
smoke tp1 --runs baseline,DFLASH --gpu 0

# every request's output ids, TP=2 against TP=1, per run and prompt (the recordings keep them)
$PY - "$WORK/rec-tp2" "$WORK/rec-tp1" "$OUT/tp2-vs-tp1.json" <<'PYEOF' 2>&1 | tee -a "$summary"
import json, sys
from pathlib import Path
tp2, tp1, out = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def ids(path):
    doc = json.loads(path.read_text())
    return {json.dumps(g["request"]["input_ids"]) + str(g["request"]["sampling_params"]["max_new_tokens"]):
            g["final"].get("output_ids") for g in doc["generate"]}
result = {}
base1 = ids(tp1 / "baseline.json") if (tp1 / "baseline.json").exists() else {}
for f in sorted(tp2.glob("*.json")):
    two = ids(f)
    same = sum(1 for k, v in two.items() if base1.get(k) == v)
    result[f.stem] = {"requests": len(two), "identical_to_tp1_baseline": same}
    print(f"{f.stem} at TP=2: {same}/{len(two)} requests identical to plain decoding at TP=1")
json.dump(result, open(out, "w"), indent=2)
PYEOF
$PY - "$OUT/tp2-devices.json" <<'PYEOF' 2>&1 | tee -a "$summary"
import json, sys
d = json.load(open(sys.argv[1]))
for path, v in d["char_devices"].items():
    print(f"  {path} {v['major']}:{v['minor']} {v['group']}: {v['allowed_by'] or 'NOT ALLOWED by the unit'}")
print(f"  /dev/shm: {len(d['dev_shm_files'])} files, e.g. {d['dev_shm_files'][:3]}; sockets: {d['socket_families']}")
PYEOF
grep -h "NCCL INFO" "$WORK"/logs/tp2/*.log 2>/dev/null | grep -E "via P2P|via SHM|NVLS|Channel 00|cuMem|comm 0x" \
  | sed 's/^\[[^]]*\] //' | sort | uniq -c | head -20 | tee -a "$summary"
tar -C "$WORK" -czf "$OUT/logs-tp.tar.gz" logs 2>/dev/null
stamp "done"
