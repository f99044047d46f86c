#!/usr/bin/env bash
# Does a first start import from byte code, as a Nix or pip host does? (issue 21). A Nix host's
# Python packages hold their byte code in the store (nixpkgs installs each wheel with PyPA's
# installer, which compiles optimisation levels 0 and 1); pip compiles at install too. The device's
# payload is unpacked wheels: no byte code, and an interpreter that may not write any. One device
# call on a fresh H200:
#   1. facts: PYTHON* settings, sys.flags.dont_write_bytecode, .py and .pyc counts in the payload
#      and in the device's own site-packages (torch, triton)
#   2. what a spawned scheduler child imports (SGLang's HTTP server and scheduler), alone, twice
#      (IMPORTS_BEFORE=0 skips it), and doctor's bytecode line
#   3. compileall over the payload and the device's site-packages (what the install would have
#      done; BYTECODE_MODE, default checked-hash: what a Nix build writes, since nixpkgs sets
#      SOURCE_DATE_EPOCH and py_compile then defaults to it), doctor's bytecode line again, then
#      the same import twice more
#   4. `RUNS=0 prebuilt_kernels.sh build`, then fresh default smokes with the prebuilt kernels
#      (RUNS, default 3), then one side by side with no byte code (PYTHONPYCACHEPREFIX at an
#      empty directory and PYTHONDONTWRITEBYTECODE=1: every module compiled at every import, as
#      before step 3)
#   5. as time allows, -X importtime of that import, alone, with byte code (importtime.txt.gz)
# Writes summary.txt, build-summary.txt, doctor-before.json, doctor-after.json, <label>.json, logs-bytecode.tar.gz, importtime.txt.gz.
set -uo pipefail
D=${PAYLOAD_DIR:-$PWD/.gpu-i21}
OUT=${OUT:-$PWD/bytecode-out}
mkdir -p "$OUT" /tmp/i21
K=/tmp/i21/prebuilt
RUNS_DIR=/tmp/i21/bytecode
PY=python3
summary="$OUT/summary.txt"
LOGS_TAR=$OUT/logs-bytecode.tar.gz
source "$(dirname "$0")/common.sh"
rm -rf "$RUNS_DIR"; mkdir -p "$RUNS_DIR"
unpack_payload "$D" || exit 3
export PYTHONPATH=$D/python:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SYSTEM_SITE=$($PY -c "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('torch').origin)))")
stamp "bytecode: $(nproc) cores; environment: $(env | grep -E '^PYTHON' | grep -v '^PYTHONPATH' | tr '\n' ' ')"
stamp "interpreter: $($PY -c 'import sys; print(f"dont_write_bytecode={sys.flags.dont_write_bytecode} pycache_prefix={sys.pycache_prefix} {sys.version.split()[0]}")')"
counts() {  # directory
  echo "$(find "$1" -name '*.py' | wc -l) .py, $(find "$1" -name '*.pyc' | wc -l) .pyc"
}
stamp "payload /tmp/site: $(counts /tmp/site); device's $SYSTEM_SITE: torch $(counts "$SYSTEM_SITE/torch"), triton $(counts "$SYSTEM_SITE/triton"), all $(counts "$SYSTEM_SITE")"

import_alone() { stamp "import $1: $($PY -c "$SCHEDULER_IMPORTS" 2>&1 | tail -n1) s"; }
doctor_line() {  # label: doctor's bytecode check, its JSON kept as doctor-LABEL.json
  $PY -m dflashctl doctor --json >"$OUT/doctor-$1.json" 2>/dev/null
  stamp "doctor $1: $($PY -c "import json, sys; c = [c for c in json.load(open(sys.argv[1]))['checks'] if c['name'] == 'bytecode'][0]; print(c['status'], c['summary'], '| fix:', c['fix'])" "$OUT/doctor-$1.json" 2>&1 | tail -n1)"
}
if [ "${IMPORTS_BEFORE:-1}" = 1 ]; then
  import_alone "before compileall (1)"
  import_alone "before compileall (2)"
  stamp "payload after two imports: $(counts /tmp/site)"
fi
doctor_line before
MODE=${BYTECODE_MODE:-checked-hash}
s=$(ms)
$PY -m compileall -q -j0 --invalidation-mode "$MODE" /tmp/site >/dev/null 2>&1
$PY -m compileall -q -j0 --invalidation-mode "$MODE" "$SYSTEM_SITE" >/dev/null 2>&1
stamp "compileall ($MODE) payload and $SYSTEM_SITE: $(secs_since "$s")s; payload $(counts /tmp/site); device's torch $(counts "$SYSTEM_SITE/torch")"
doctor_line after
import_alone "with byte code (1)"
import_alone "with byte code (2)"

BUDGET=$(( $(left) - 5 )) RUNS=0 OUT=$OUT/build bash "$(dirname "$0")/prebuilt_kernels.sh" build >/dev/null 2>&1
cp "$OUT/build/summary.txt" "$OUT/build-summary.txt" 2>/dev/null
stamp "kernels build: $(grep -c 'every module prebuilt' "$OUT/build/summary.txt" 2>/dev/null) coverage line(s)"
[ -f "$K/index.json" ] || { stamp "no prebuilt kernels: no runs"; exit 1; }
rm -rf "$OUT/build"
for i in $(seq 1 "${RUNS:-3}"); do
  fresh_smoke "bytecode$i" DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1
done
mkdir -p /tmp/i21/no-pycache
fresh_smoke no-bytecode DFLASH_PREBUILT_KERNELS="$K" FLASHINFER_DISABLE_JIT=1 \
  PYTHONPYCACHEPREFIX=/tmp/i21/no-pycache PYTHONDONTWRITEBYTECODE=1
if [ "$(left)" -gt 40 ]; then
  $PY -X importtime -c "$SCHEDULER_IMPORTS" 2>"$RUNS_DIR/importtime.txt" >/dev/null
  gzip -c "$RUNS_DIR/importtime.txt" >"$OUT/importtime.txt.gz"
  stamp "importtime: $(wc -l <"$RUNS_DIR/importtime.txt") modules"
fi
stamp "done"
