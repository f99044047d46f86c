#!/usr/bin/env bash
# What SGLang 0.5.11 does with a drafter that does not fit its target, started without the check,
# beside the time serve's preflight takes to refuse the same pair (issue 33). The synthetic pair
# (smoke/synthetic.py: an 8-layer Qwen3 target, dummy weights, no tokenizer) with broken drafters:
#   wide: the drafter's hidden_size 2048 against the target's 1024
#   past: dflash_config.target_layer_ids [1, 9], the target has 8 layers (0..7)
#   last: target_layer_ids [1, 7]: within the target, but its last layer (which SGLang's capture
#         hook never records, by its source: the rule refuses it; this records what SGLang does)
#   fits: the pair as the smoke writes it (the control: it must serve, with its acceptance)
# For each: `dflashctl serve --skip-preflight` (serve's own path to SGLang, no model check): the
# seconds to exit and the log's last lines, or, if it became ready, a /generate's acceptance; then
# `dflashctl serve` with its preflight (must exit 79 naming the mismatch, SGLang never started) and
# `dflashctl validate --models`, timed. Nothing is downloaded; at most BUDGET (540) seconds.
# Device command (carry .gpu-i21 with payload.tar.xz, as for prebuilt_kernels.sh):
#   bash benchmarks/gpu/model_pair.sh
# Writes summary.txt, <case>-settings.json, <case>-serve.log, <case>-refused.log, logs-model-pair.tar.gz
# into $OUT.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/model-pair-out}
mkdir -p "$OUT"
RUNS_DIR=/tmp/i33/model-pair
PY=python3
summary="$OUT/summary.txt"
LOGS_TAR=$OUT/logs-model-pair.tar.gz
source "$(dirname "$0")/common.sh"
rm -rf "$RUNS_DIR"; mkdir -p "$RUNS_DIR"
unpack_payload "$D"
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
stamp "model pair: $(nproc) cores, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

# The pairs and each case's settings (serve.sh's synthetic instance, one port per case).
$PY - "$RUNS_DIR" <<'PY'
import json, shutil, sys
from pathlib import Path
from dflashctl.smoke import synthetic
root = Path(sys.argv[1])
target, draft = synthetic.write_pair(root / "models")
edits = {"wide": lambda d: d.update(hidden_size=2048),
         "past": lambda d: d["dflash_config"].update(target_layer_ids=[1, 9]),
         "last": lambda d: d["dflash_config"].update(target_layer_ids=[1, 7]),
         "fits": lambda d: None}
for port, (case, edit) in enumerate(edits.items(), 31000):
    d = root / "models" / f"draft-{case}"
    shutil.copytree(draft, d, dirs_exist_ok=True)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    settings = {"name": case, "model": str(target), "draftModel": str(d), "port": port, "gpus": [0],
                "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
                "attentionBackend": "triton", "samplingBackend": "pytorch", "loadFormat": "dummy",
                "draftLoadFormat": "dummy", "skipTokenizerInit": True, "memFractionStatic": 0.5,
                "cudaGraphMaxBs": 8, "extraArgs": ["--disable-piecewise-cuda-graph"], "startTimeoutSec": 300,
                "stallTimeoutSec": 120, "cacheDir": str(root / "cache")}
    (root / f"{case}.json").write_text(json.dumps(settings, indent=2))
PY
cp "$RUNS_DIR"/*.json "$OUT/" 2>/dev/null; for c in wide past last fits; do mv "$OUT/$c.json" "$OUT/$c-settings.json"; done

# without_check CASE: serve --skip-preflight with a notify socket; exit and seconds, or READY and a
# /generate's acceptance, then SIGTERM. At most 170 s or what is left of the budget.
without_check() {
  local case=$1 secs; secs=$(left); [ "$secs" -gt 170 ] && secs=170
  if [ "$secs" -lt 40 ]; then stamp "$case: without the check: skipped, ${secs}s left"; return; fi
  $PY - "$RUNS_DIR/$case.json" "$OUT/$case-serve.log" "$secs" >>"$RUNS_DIR/$case.result" 2>&1 <<'PY'
import json, os, signal, socket, subprocess, sys, tempfile, time, urllib.request
settings, log, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
port = json.load(open(settings))["port"]
sock_path = os.path.join(tempfile.mkdtemp(), "notify.sock")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); sock.bind(sock_path); sock.settimeout(0.5)
t0 = time.monotonic()
child = subprocess.Popen([sys.executable, "-m", "dflashctl", "serve", "--config", settings, "--skip-preflight",
                          "--log-file", log + ".sglang"], env=dict(os.environ, NOTIFY_SOCKET=sock_path),
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
ready = None
while time.monotonic() - t0 < limit and child.poll() is None:
    try:
        if "READY=1" in sock.recv(4096).decode():
            ready = time.monotonic() - t0
            break
    except socket.timeout:
        pass
if ready is None:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM); child.wait(60)
        print(f"no exit and no READY=1 within {limit:.0f} s (stopped)")
    else:
        print(f"serve exit {child.returncode} after {time.monotonic() - t0:.1f} s, SGLang never ready")
    sys.exit(0)
body = json.dumps({"input_ids": list(range(1, 33)), "sampling_params": {"max_new_tokens": 128, "temperature": 0,
                                                                         "ignore_eos": True}}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body, {"Content-Type": "application/json"})
try:
    meta = json.loads(urllib.request.urlopen(req, timeout=120).read()).get("meta_info", {})
    print(f"READY=1 after {ready:.1f} s; /generate: " + json.dumps({k: meta.get(k) for k in (
        "completion_tokens", "spec_verify_ct", "spec_accept_length", "e2e_latency")}))
except Exception as e:  # what SGLang answers is the finding
    print(f"READY=1 after {ready:.1f} s; /generate failed: {type(e).__name__}: {e}; serve exit {child.poll()}")
if child.poll() is None:
    child.send_signal(signal.SIGTERM); child.wait(60)
PY
  stamp "$case: without the check: $(tail -n1 "$RUNS_DIR/$case.result")"
  {
    echo "  SGLang's last lines ($case):"
    grep -hE 'Error|error|mismatch|Traceback|raise|DFLASH|out-of-range|warning' "$OUT/$case-serve.log" 2>/dev/null \
      | grep -v '^\s*$' | tail -n 12 | cut -c1-300 | sed 's/^/    /'
  } >>"$summary"
}

# with_check CASE: serve with its preflight, and validate --models, each timed (the fitting pair:
# validate only, since serve would start it).
with_check() {
  local case=$1 s rc
  if [ "$case" = fits ]; then
    s=$(ms)
    $PY -m dflashctl validate "$RUNS_DIR/$case.json" --models >"$RUNS_DIR/$case-validate.log" 2>&1
    stamp "$case: validate --models: exit $? after $(secs_since "$s")s"
    return
  fi
  s=$(ms)
  $PY -m dflashctl serve --config "$RUNS_DIR/$case.json" --log-file "$RUNS_DIR/$case-refused.sglang" \
    >"$OUT/$case-refused.log" 2>&1
  rc=$?
  stamp "$case: serve with preflight: exit $rc after $(secs_since "$s")s; $(grep -c '^    | [0-9]*\. models:' "$OUT/$case-refused.log") model finding(s): $(grep -o 'models: [a-z_A-Z]*' "$OUT/$case-refused.log" | sort -u | tr '\n' ' ')"
  [ -f "$RUNS_DIR/$case-refused.sglang" ] && stamp "$case: SGLang was started despite the check (log $RUNS_DIR/$case-refused.sglang)"
  s=$(ms)
  $PY -m dflashctl validate "$RUNS_DIR/$case.json" --models >"$RUNS_DIR/$case-validate.log" 2>&1
  rc=$?
  stamp "$case: validate --models: exit $rc after $(secs_since "$s")s"
}

# Refusals first (seconds each), then SGLang without the check, the fitting pair last.
for c in wide past last fits; do with_check "$c"; done
for c in past wide last fits; do without_check "$c"; done
tar -C "$OUT" -czf "$LOGS_TAR" $(cd "$OUT" && ls ./*-serve.log* ./*-refused.log 2>/dev/null) 2>/dev/null
stamp "done"
cat "$summary"
