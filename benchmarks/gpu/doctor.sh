#!/usr/bin/env bash
# doctor on the lent H200, twice: in the pinned stack, then with one deliberately wrong package
# (xgrammar 0.1.10 in front of PYTHONPATH), and a diff of the two fingerprints. Writes into $OUT:
# good.json/.txt, wrong.json/.txt, diff.txt/.json, times.txt.
# Local steps first: the payload (benchmarks/README.md); benchmarks/gpu/prepare_wrong_xgrammar.sh.
# Device command (carry .gpu):  bash benchmarks/gpu/doctor.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/doctor-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python:$PYTHONPATH  # dflashctl itself, standard library + packaging
lock=nix/python-lock.json
table() { python3 -c 'import sys; from dflashctl.host import doctor, fingerprint; sys.stdout.write(doctor.render(fingerprint.load(sys.argv[1])))' "$1"; }
run() {  # name, extra PYTHONPATH front
  local name=$1 front=$2 t0 t1 rc
  t0=$(date +%s.%N)
  PYTHONPATH=$front$PYTHONPATH python3 -m dflashctl doctor --lock "$lock" --json --save "$OUT/$name.json" >/dev/null
  rc=$?; t1=$(date +%s.%N)
  awk -v n="$name" -v rc="$rc" -v d="$(echo "$t1 $t0")" 'BEGIN{split(d,t," "); printf "%s: exit %s, %.1f s wall\n", n, rc, t[1]-t[2]}' | tee -a "$OUT/times.txt"
  table "$OUT/$name.json" | tee "$OUT/$name.txt"
}
: > "$OUT/times.txt"
nproc | sed 's/^/cpus: /' >> "$OUT/times.txt"
run good ""
run good-warm ""  # second run: page cache warm, as on a host that has run it before
run wrong "$PWD/.gpu/wrong-xgrammar:"
python3 -m dflashctl diff "$OUT/good.json" "$OUT/wrong.json" | tee "$OUT/diff.txt"
echo "diff exit: ${PIPESTATUS[0]}" | tee -a "$OUT/times.txt"
python3 -m dflashctl diff "$OUT/good.json" "$OUT/wrong.json" --json > "$OUT/diff.json"
python3 -m dflashctl diff "$OUT/good.json" "$OUT/good-warm.json" > "$OUT/diff-same.txt"
echo "diff good vs good-warm exit: $?" | tee -a "$OUT/times.txt"
