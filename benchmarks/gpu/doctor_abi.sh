#!/usr/bin/env bash
# The story's ABI failure on the lent H200 (a CT200-like host): "another sgl_kernel build" in front
# of the pinned stack, then doctor, diff and serve's preflight must name the undefined C++ symbol,
# demangled, what it means and the fix.
#
# "Another build" = a copy of the installed sgl_kernel package (symlinks, no 300 MiB copy) placed first
# on PYTHONPATH, whose sm90/common_ops.abi3.so is replaced by a small library compiled here with gcc
# that links torch's libc10_cuda.so and needs c10::cuda::c10_cuda_check_implementation with a
# signature this torch does not export (the story's `_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb`
# when this torch lacks it, else the other build's `...EiPKcS2_ib`). Python loads it RTLD_NOW, so
# the dynamic loader refuses it exactly as on the story's host.
#
# Device command (carry .gpu, the payload: benchmarks/README.md): bash benchmarks/gpu/doctor_abi.sh
# Writes into $OUT: good.json, abi.json, abi.txt (doctor's table), diff.txt, diff.json, serve.txt,
# evidence.txt. About 30 s (three doctor/preflight runs of ~7 s each).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/doctor-abi-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python:$PYTHONPATH  # dflashctl itself
lock=nix/python-lock.json
work=$(mktemp -d); front=$work/front
ev() { echo "$*" | tee -a "$OUT/evidence.txt"; }
: > "$OUT/evidence.txt"

# 1. the other build: the installed package mirrored with symlinks, common_ops replaced
kernel=$(python3 -c 'import importlib.util as u; print(list(u.find_spec("sgl_kernel").submodule_search_locations)[0])')
torchlib=$(python3 -c 'import importlib.util as u, os; print(os.path.join(list(u.find_spec("torch").submodule_search_locations)[0], "lib"))')
ev "installed sgl_kernel: $kernel"
ev "torch's libraries:    $torchlib"
symbol=$(python3 - "$torchlib/libc10_cuda.so" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
story, other = ("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb",
                "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib")
have = {s: hasattr(lib, s) for s in (story, other)}
print(f"libc10_cuda exports: {have}", file=sys.stderr)
print(story if not have[story] else other)
PY
)
ev "the other build needs: $symbol (not exported by this torch)"
mkdir -p "$front/sgl_kernel/sm90"
for entry in "$kernel"/*; do  # not sm90/, nor a top-level common_ops (the loader's fallback)
  case $(basename "$entry") in sm90|common_ops*) ;; *) ln -s "$entry" "$front/sgl_kernel/" ;; esac
done
for entry in "$kernel"/sm90/*; do
  case $(basename "$entry") in common_ops*) ;; *) ln -s "$entry" "$front/sgl_kernel/sm90/" ;; esac
done
cc=$(command -v gcc || command -v cc || command -v c++) || { ev "no C compiler on this host"; exit 1; }
printf 'extern void %s(void);\nvoid sgl_kernel_other_build(void) { %s(); }\n' "$symbol" "$symbol" > "$work/other.c"
"$cc" -shared -fPIC -o "$front/sgl_kernel/sm90/common_ops.abi3.so" "$work/other.c" \
  -L"$torchlib" -lc10_cuda -Wl,-rpath,"$torchlib" || { ev "compiling the stand-in common_ops failed"; exit 1; }
ev "stand-in common_ops: $(ls -l "$front/sgl_kernel/sm90/common_ops.abi3.so" | awk '{print $5}') bytes, built with $cc"
ev "c++filt on this host: $(command -v c++filt || echo none; true)"

# 2. doctor: the pinned stack, then with the other build in front
# runs "$@", then notes its exit status and wall time (on stderr: stdout may be redirected to a file)
timed() { local t0=$(date +%s%N); "$@"; local rc=$?; ev "$(printf '%s: exit %s, %.1f s' "$label" "$rc" "$(( $(date +%s%N) - t0 ))e-9")" >&2; }
label="doctor (pinned stack)" timed python3 -m dflashctl doctor --lock "$lock" --json --save "$OUT/good.json" >/dev/null
label="doctor (other sgl_kernel build in front)" timed \
  env PYTHONPATH="$front:$PYTHONPATH" python3 -m dflashctl doctor --lock "$lock" --save "$OUT/abi.json" > "$OUT/abi.txt"
cat "$OUT/abi.txt"
ev "sgl_kernel check, as saved:"
python3 -c 'import json, sys; c = next(c for c in json.load(open(sys.argv[1]))["checks"] if c["name"] == "sgl_kernel"); print(json.dumps({k: c[k] for k in ("status", "summary", "fix", "exit_code")}, indent=2)); print("undefined_symbol:", c["details"].get("undefined_symbol")); print("demangled:", c["details"].get("undefined_symbol_demangled"))' "$OUT/abi.json" | tee -a "$OUT/evidence.txt"

# 3. diff: the failure first, with its fix
label="diff good abi" timed python3 -m dflashctl diff "$OUT/good.json" "$OUT/abi.json" > "$OUT/diff.txt"
python3 -m dflashctl diff "$OUT/good.json" "$OUT/abi.json" --json > "$OUT/diff.json"
cat "$OUT/diff.txt"

# 4. serve's preflight on the same environment: refused before SGLang starts, every failure listed
printf '{"name": "abi", "model": "stand-in", "port": 31001}\n' > "$work/abi.json"
label="serve preflight" timed env PYTHONPATH="$front:$PYTHONPATH" python3 -m dflashctl serve --config "$work/abi.json" \
  --log-file "$work/sglang.log" > "$OUT/serve.txt" 2>&1
cat "$OUT/serve.txt"
ev "SGLang log written (must be 'no'): $([ -e "$work/sglang.log" ] && echo yes || echo no)"
rm -rf "$work"
