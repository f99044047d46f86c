#!/usr/bin/env bash
# The default `dflashctl smoke` with its grammar phase, on a GPU machine: evidence for docs/gpu/.
#
# Run from the repository root; the script sets the stack up (common.sh: locked wheels in /tmp/site on
# PYTHONPATH; the payload must hold openai and tokenizers, as the lock does), e.g. through the
# device tool with carry [".gpu"]:
#     bash benchmarks/gpu/smoke_grammar.sh
# Extra arguments go to smoke, e.g. `... smoke_grammar.sh --runs baseline,DFLASH --launch sequential`.
#   OUT=DIR              where the files go (default ./smoke-grammar-out)
#   SMOKE_LABEL=NAME     file-name prefix, to run it twice into one $OUT (default grammar)
#   SMOKE_LIMIT=S        seconds smoke may take (default 420)
#
# Writes 5 files into $OUT: NAME-summary.txt (versions, tokenizer hash, both tables), NAME.json
# (smoke's full result, the `grammar` block included), NAME.out (table and progress),
# NAME-logs.txt (SGLang's grammar and error lines, log tails) and NAME-recorded.tar.gz (every
# response, the grammar answers included: `tar -xzf` into tests/data/smoke/ to replay them).
set -uo pipefail
OUT=${OUT:-$PWD/smoke-grammar-out}
L=${SMOKE_LABEL:-grammar}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
summary="$OUT/$L-summary.txt"
work=/tmp/smoke-$L
rm -rf "$work" "/tmp/smoke-$L-rec"

{
  machine_facts sglang xgrammar transformers tokenizers openai torch
  echo "== synthetic tokenizer, built twice (the same sha256 here, on the dev machine and in tests)"
  for i in 1 2; do
    "$PY" -c 'import sys, json; from dflashctl.smoke import tokenizer
info = tokenizer.write(sys.argv[1], 151936); print(info["vocab_size"], "tokens", info["seconds"], "s", info["sha256"])' \
      "/tmp/tok-$L-$i" 2>&1
  done
} >"$summary"

t0=$(date +%s)
timeout --signal=TERM --kill-after=15 "${SMOKE_LIMIT:-420}" "$PY" -m dflashctl smoke --work-dir "$work" \
  --triton-cache "/tmp/triton-$L" --record "/tmp/smoke-$L-rec" --json "$OUT/$L.json" "$@" >"$OUT/$L.out" 2>&1
rc=$?
echo "== smoke exit $rc after $(( $(date +%s) - t0 ))s (0 ok; 5 a grammar violation; 1 another failure)" >>"$summary"
[ -d "/tmp/smoke-$L-rec" ] && tar -C "/tmp/smoke-$L-rec" -czf "$OUT/$L-recorded.tar.gz" .

: >"$OUT/$L-logs.txt"
for f in "$work"/logs/*.log; do
  [ -e "$f" ] || continue
  { echo "===== $(basename "$f"): grammar, tokenizer and error lines"
    grep -E -i 'grammar|xgrammar|tokenizer|constrained|json_schema|structural|Traceback|Error|exited' "$f" \
      | cut -c1-400 | head -n 120
    echo "===== $(basename "$f"): last 40 lines"; tail -n 40 "$f" | cut -c1-400; } >>"$OUT/$L-logs.txt"
done

{
  echo "== tables"
  grep -v '^\[smoke\]' "$OUT/$L.out" | head -n 60
  echo "== grammar rows from the JSON"
  "$PY" - "$OUT/$L.json" <<'PYEOF' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
print("ok", r.get("ok"), "failures", r.get("failures"))
g = r.get("grammar") or {}
print("client:", g.get("client"), "| tokenizer:", (g.get("tokenizer") or {}).get("sha256"))
for s in g.get("servers", []):
    print(f"{s['run']}: SGLang {s['version']}, tokenizer {s['tokenizer']}, backend {s['grammar_backend']}, "
          f"JSON whitespace {s['json_whitespace']}: {s['verdict']}")
    for row in s["rows"]:
        print(f"  {row['kind']:15} {row['api']:14} {row['status']:9} http {row['http_status']} "
              f"finish {row['finish_reason']} {row['seconds']}s  {row['output']!r} {row['problem'] or ''}")
PYEOF
} >>"$summary"
cat "$summary"
exit $rc
