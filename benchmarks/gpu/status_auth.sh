#!/usr/bin/env bash
# Real SGLang 0.5.11 with an API key: what it answers without the key (route by route), and
# `dflashctl status` over it with the key readable, unreadable and wrong (issue 42, part A):
# benchmarks/gpu/status_auth.py (one oracle-pair DFLASH instance under `dflashctl serve`).
#
# Device command, from the repository root, with the stack's payload carried as .gpu (it holds
# payload.tar.xz; unpacked once a machine into /tmp/site, as common.sh does for the other scripts):
#     bash benchmarks/gpu/status_auth.sh
# Expected: 80-110 s on a fresh H200 (unpacking ~10 s, byte code 12-15 s, the instance ready after
# 40-60 s, four status calls ~10 s); hard stop at AUTH_BUDGET (150) seconds from the start.
# Knobs: AUTH_BUDGET (150), BYTECODE (1; 0 skips it), PAYLOAD_DIR (.gpu), PYTHON (python3),
# SERVE_ARGS (extra `dflashctl serve` arguments, split at spaces). A dry run without a GPU, in a
# private /tmp (the stand-in copies SGLang's auth middleware):
#   SERVE_ARGS=--skip-preflight DFLASHCTL_SGLANG_LAUNCHER="python3 tests/data/service/standin_server.py" \
#   PAYLOAD_DIR=DIR-WITH-ANY-payload.tar.xz unshare -m sh -c 'mount -t tmpfs tmpfs /tmp && bash benchmarks/gpu/status_auth.sh'
# Writes into $OUT (default $PWD/status-auth-out): summary.txt, status-auth.txt (what it printed),
# status-auth.json (the answers without the key, each status call's verdict), status-auth-logs.txt.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu}
OUT=${OUT:-$PWD/status-auth-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${AUTH_BUDGET:-150}
summary="$OUT/summary.txt"
: >"$summary"
source "$(dirname "$0")/common.sh"
unpack_payload "$D" || exit 3
stamp "payload: /tmp/site unpacked; $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -1)"
export PYTHONPATH=$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

compile_bytecode

work=$(mktemp -d)
secs=$(( $(left) - 3 ))
if [ "$secs" -lt 40 ]; then stamp "measurement skipped: ${secs}s left"; exit 4; fi
serve_args=()
[ -n "${SERVE_ARGS:-}" ] && read -r -a serve_args <<<"$SERVE_ARGS"
stamp "status_auth.py: budget ${secs}s"
timeout --signal=INT --kill-after=10 "$secs" $PY benchmarks/gpu/status_auth.py --work "$work" \
  --python "$(command -v "$PY")" --out "$OUT" --budget "$((secs - 2))" \
  "${serve_args[@]/#/--serve-arg=}" 2>&1 | tee "$OUT/status-auth.txt"
stamp "status_auth.py: exit ${PIPESTATUS[0]}"
grep -E "^ready after|^status, key|^total " "$OUT/status-auth.txt" >>"$summary"
for f in "$work"/serve-*.log; do
  [ -e "$f" ] || continue
  { echo "===== $f (key lines)"; grep -E "api.key|Unauthorized|ready|READY|exit|Traceback|Error" "$f" | cut -c1-300 | head -30
    echo "===== $f (last 15 lines)"; tail -n 15 "$f" | cut -c1-300; } >>"$OUT/status-auth-logs.txt"
done
stamp "done"
