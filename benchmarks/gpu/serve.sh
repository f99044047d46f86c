#!/usr/bin/env bash
# `dflashctl serve` on a GPU host, as systemd would run it, twice:
#   refused: xgrammar 0.1.10 in front of PYTHONPATH (prepare_wrong_xgrammar.sh): preflight must exit
#            82 (PREFLIGHT_GRAMMAR) within seconds, before any weights load (the grammar check is one of
#            the stack's, run beside SGLang's start: SGLang is stopped, nothing of it left);
#   served:  the synthetic DFLASH pair with grammarBackend xgrammar, a real NOTIFY_SOCKET: READY=1
#            must come only after a real decode; a /generate must then decode; SIGTERM must stop it.
# Run from the repo root (the script sets the stack up: benchmarks/README.md); writes serve-*.txt/json into $OUT.
# SERVE_ONLY=1: the served instance alone (no prepared .gpu/wrong-xgrammar needed); REFUSED_ONLY=1: the
# refused one alone.
set -uo pipefail
OUT=${OUT:-/tmp/serve-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d)
python3 - "$work" <<'PY'
import json, sys
from pathlib import Path
from dflashctl.smoke import synthetic
work = Path(sys.argv[1])
target, draft = synthetic.write_pair(work / "models")
settings = {"name": "gpu0", "model": str(target), "draftModel": str(draft), "port": 31000,
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
            "gpus": [0], "attentionBackend": "triton", "samplingBackend": "pytorch", "loadFormat": "dummy",
            "draftLoadFormat": "dummy", "skipTokenizerInit": True, "memFractionStatic": 0.5,
            "cudaGraphMaxBs": 8, "extraArgs": ["--disable-piecewise-cuda-graph"], "startTimeoutSec": 400,
            "cacheDir": str(work / "cache")}
(work / "gpu0.json").write_text(json.dumps(settings, indent=2))
PY
cp "$work/gpu0.json" "$OUT/serve-settings.json"

ms() { echo $(( $(date +%s%N) / 1000000 )); }
# 1. refused: the broken xgrammar
: >"$OUT/serve-summary.txt"
if [ "${SERVE_ONLY:-0}" != 1 ]; then
  t0=$(ms)
  PYTHONPATH=$PWD/.gpu/wrong-xgrammar:$PYTHONPATH python3 -m dflashctl serve --config "$work/gpu0.json" \
    >"$work/refused.log" 2>&1
  rc=$?
  echo "refused: exit $rc after $(( $(ms) - t0 )) ms" >>"$OUT/serve-summary.txt"
  cat "$work/refused.log" >>"$OUT/serve-summary.txt"
  sleep 1; echo "SGLang processes left: $(pgrep -af 'sglang.launch_server|sglang::' || echo none)" >>"$OUT/serve-summary.txt"
fi
if [ "${REFUSED_ONLY:-0}" = 1 ]; then cat "$OUT/serve-summary.txt"; exit 0; fi

# 2. served, with a notify socket that timestamps every datagram
python3 - "$work" >>"$OUT/serve-summary.txt" 2>&1 <<'PY'
import json, os, signal, socket, subprocess, sys, time, urllib.request
work = sys.argv[1]
sock_path = os.path.join(work, "notify.sock")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); sock.bind(sock_path); sock.settimeout(1)
env = dict(os.environ, NOTIFY_SOCKET=sock_path)
t0 = time.monotonic()
child = subprocess.Popen([sys.executable, "-m", "dflashctl", "serve", "--config", os.path.join(work, "gpu0.json")],
                         env=env, stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT)
events, ready = [], None
while time.monotonic() - t0 < 420 and child.poll() is None:
    try:
        msg = sock.recv(4096).decode()
    except socket.timeout:
        continue
    events.append((round(time.monotonic() - t0, 1), msg))
    if "READY=1" in msg:
        ready = time.monotonic() - t0
        break
print(f"served: READY=1 after {ready:.1f} s" if ready else f"served: no READY=1 (serve exit {child.poll()})")
for t, m in events:
    print(f"  notify {t:7.1f} s  {m.strip()}")
if ready:
    body = json.dumps({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "sampling_params": {"max_new_tokens": 64,
                       "temperature": 0, "ignore_eos": True}}).encode()
    req = urllib.request.Request("http://127.0.0.1:31000/generate", body, {"Content-Type": "application/json"})
    out = json.loads(urllib.request.urlopen(req, timeout=60).read())
    meta = out.get("meta_info", {})
    print("generate after READY:", {k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct",
                                                            "spec_accept_length", "e2e_latency")})
    t1 = time.monotonic()
    child.send_signal(signal.SIGTERM)
    rc = child.wait(timeout=60)
    print(f"SIGTERM: serve exit {rc} after {time.monotonic() - t1:.1f} s")
    try:
        while True:
            print("  notify after SIGTERM:", sock.recv(4096).decode().strip())
    except socket.timeout:
        pass
else:
    child.kill()
PY
tail -n 40 "$work/serve.log" >"$OUT/serve-log-tail.txt"
cat "$OUT/serve-summary.txt"
