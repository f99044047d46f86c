#!/usr/bin/env bash
# The smoke's Triton kernels for Blackwell, carried from the shipped sm90 recording and compiled with
# no GPU visible (issue 36): the real SGLang 0.5.11 kernels, as `dflashctl kernels build --smoke`
# builds them (host/triton_kernels.py `carry`), then what its index says for each arch. Needs the
# stack's interpreter (torch, Triton 3.6.0 and SGLang importable) and gcc, not a GPU: any machine
# with the payload, the H200 device included (CPU only, about 30 s per arch on 16 cores).
#     source .gpu/setup.sh && bash benchmarks/gpu/blackwell_triton.sh [sm120 [sm100]]
# Writes into $OUT: blackwell-triton.txt (the build's lines and the status of each arch),
# blackwell-triton-index.json (the prebuilt directory's index.json).
set -uo pipefail
OUT=${OUT:-$PWD/blackwell-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$PWD/python:$SITE PYTHONUNBUFFERED=1
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(sm120 sm100)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
dir=$scratch/prebuilt
mkdir -p "$dir"
log=$OUT/blackwell-triton.txt
{
  echo "== carried from the shipped sm90 recording: ${archs[*]}, $(nproc) cores, no GPU visible"
  CUDA_VISIBLE_DEVICES= $PY - "$dir" "${archs[@]}" <<'PYEOF'
import os, sys, time
from pathlib import Path
from dflashctl.errors import DflashError
from dflashctl.host import kernels
out, archs = Path(sys.argv[1]), sys.argv[2:]
t = time.monotonic()
try:
    kernels.build_triton(sys.executable, out, archs, [], True, dict(os.environ))
except DflashError as e:
    print(f"FAILED: {e}")
print(f"build: {time.monotonic() - t:.1f} s")
PYEOF
  echo "== what the index says per arch (what doctor and kernels status report once the tvm-ffi modules are built too)"
  $PY - "$dir/index.json" <<'PYEOF'
import json, sys
index = json.load(open(sys.argv[1]))
for arch, hashes in sorted(index.get("triton", {}).items()):
    c = index.get("triton_carried", {}).get(arch, {})
    left = sorted({x["kernel"] for x in c.get("left_out", [])})
    print(f"{arch}: {len(hashes)} Triton kernels, {len(c.get('kernels', []))} carried from {c.get('from')}; "
          f"left out: {len(c.get('left_out', []))} ({', '.join(left)})")
PYEOF
  echo "== compiled: $(find "$dir/triton" -name '*.cubin' | wc -l) cubins, $(find "$dir/triton" -name '*.so' | wc -l) helper modules"
  $PY - "$dir/triton" <<'PYEOF'
import collections, json, sys
from pathlib import Path
seen = collections.Counter()
for f in Path(sys.argv[1]).rglob("*.json"):
    if not f.name.startswith("__grp__"):
        m = json.loads(f.read_text())
        seen[(m["target"]["arch"], m["name"], m["num_warps"], m["num_stages"])] += 1
for (arch, name, warps, stages), n in sorted(seen.items()):
    print(f"  sm{arch} {name}: {n} (num_warps {warps}, num_stages {stages})")
PYEOF
} >"$log" 2>&1
cp "$dir/index.json" "$OUT/blackwell-triton-index.json" 2>/dev/null
cat "$log"
