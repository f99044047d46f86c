#!/usr/bin/env bash
# Driver discovery on the H200, with the loader made as blind to the driver as a Nix-built
# Python's (benchmarks/gpu/nix_loader_emulation.sh), in both layouts:
#   container: the driver stays in the image's /usr/local/nvidia/lib64 (found by the dir scan);
#   nixos:     the driver only at /run/opengl-driver/lib.
# BEFORE (the loader alone): `torch.cuda.init()` fails, doctor's NVML check says "no NVIDIA
# driver", pynvml's nvmlInit fails. AFTER (discovery): the full `dflashctl doctor` passes its
# driver-libs, driver, libcuda and torch checks; in the nixos layout pynvml, patched the way
# overlays/fixups/nvidia-ml-py.nix patches it, loads NVML from /run/opengl-driver/lib with no
# LD_LIBRARY_PATH. Also captures /proc/devices and the /dev/nvidia* nodes for
# tests/data/devices/h200-580/. Writes into $OUT: proc-devices.txt, dev-nvidia.txt,
# container.txt, nixos.txt, doctor-container.json, doctor-nixos.json, summary.txt.
# Device command (carry .gpu):  bash benchmarks/gpu/driver_discovery.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/driver-discovery-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
export PYTHONPATH=$PWD/python:$PYTHONPATH  # dflashctl itself
EMU=$PWD/benchmarks/gpu/nix_loader_emulation.sh

cat /proc/devices > "$OUT/proc-devices.txt"
ls -l /dev/nvidia* /dev/nvidia-caps/* > "$OUT/dev-nvidia.txt" 2>&1

# pynvml as the nvidia-ml-py fix-up leaves it (the same replacement; no Nix on this host).
PATCHED=$(mktemp -d)
python3 - "$PATCHED" <<'PY'
import pathlib, sys, pynvml
src = pathlib.Path(pynvml.__file__).read_text()
old = '\n                        nvmlLib = CDLL("libnvidia-ml.so.1")\n'
new = ('\n                        try:\n                            nvmlLib = CDLL("libnvidia-ml.so.1")\n'
       '                        except OSError:\n'
       '                            nvmlLib = CDLL("/run/opengl-driver/lib/libnvidia-ml.so.1")  # NixOS\n')
assert src.count(old) == 1, "pynvml.py changed: the fix-up's pattern is not there"
(pathlib.Path(sys.argv[1]) / "pynvml.py").write_text(src.replace(old, new))
PY

step() {  # layout, title, command...: one line of evidence per step
  local layout=$1 title=$2; shift 2
  local t0 t1 out rc
  t0=$(date +%s%N)
  out=$(EMULATION_QUIET=1 "$EMU" "$layout" "$@" 2>&1); rc=$?
  t1=$(date +%s%N)
  printf '%-9s %-52s exit %-3s %5ss  %s\n' "$layout" "$title" "$rc" "$(awk "BEGIN{printf \"%.1f\", ($t1 - $t0) / 1e9}")" \
    "$(echo "$out" | grep -v '^\[emulation' | tail -n 1 | cut -c1-200)" | tee -a "$OUT/summary.txt"
}
nvml_check='import sys; from dflashctl.host import probes; c = probes.check_driver(probes.run_probe(sys.executable, "driver")); print(c.status, c.summary)'
torch_init='import torch; torch.cuda.init(); print("cuda ok:", torch.cuda.get_device_name(0))'
pynvml_init='import pynvml; pynvml.nvmlInit(); print("nvmlInit ok: driver", pynvml.nvmlSystemGetDriverVersion(), "GPUs", pynvml.nvmlDeviceGetCount())'
# A child started with the environment serve and smoke give SGLang (driver.provide).
cat > "$PATCHED/as_child.py" <<'PY'
import os, subprocess, sys
from dflashctl.host import driver
env, found = driver.provide(dict(os.environ))
print(found.describe() if found else "no driver found", file=sys.stderr)
sys.exit(subprocess.call([sys.executable, "-c", sys.argv[1]], env=env))
PY
cat > "$PATCHED/doctor_lines.py" <<'PY'
import json, sys
fp = json.load(open(sys.argv[1]))
keep = ("driver-libs", "driver", "libcuda", "torch")
print("; ".join(f"{c['name']} {c['status']}: {c['summary'][:60]}" for c in fp["checks"] if c["name"] in keep))
PY

: > "$OUT/summary.txt"
echo "as is (pip loader; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}): $(python3 -c "$pynvml_init" 2>&1 | tail -n 1)" | tee -a "$OUT/summary.txt"
for layout in container nixos; do
  {
    echo "== $layout: what the emulation hides, and what the loader still sees"
    "$EMU" "$layout" sh -c 'ldconfig -p | grep -E "libcuda|libnvidia-ml" || echo "ld.so.cache: no libcuda / libnvidia-ml"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>}"; ls -l /run/opengl-driver/lib 2>/dev/null | head -5' 2>&1
  } > "$OUT/$layout.txt"
  step "$layout" "BEFORE import torch; torch.cuda.init()" python3 -c "$torch_init"
  step "$layout" "BEFORE doctor's NVML check without discovery" python3 -c "$nvml_check"
  step "$layout" "BEFORE pynvml.nvmlInit() (as locked)" python3 -c "$pynvml_init"
  step "$layout" "AFTER dflashctl doctor" sh -c "python3 -m dflashctl doctor --json --save '$OUT/doctor-$layout.json' >/dev/null; python3 '$PATCHED/doctor_lines.py' '$OUT/doctor-$layout.json'"
  step "$layout" "AFTER torch.cuda.init() in a child with serve's env" python3 "$PATCHED/as_child.py" "$torch_init"
  step "$layout" "AFTER pynvml.nvmlInit() in a child with serve's env" python3 "$PATCHED/as_child.py" "$pynvml_init"
  if [[ $layout == nixos ]]; then
    step nixos "AFTER pynvml.nvmlInit() patched as the fix-up does" \
      env PYTHONPATH="$PATCHED:$PYTHONPATH" python3 -c "$pynvml_init"
  fi
  python3 -c 'import json, sys; from dflashctl.host import doctor; sys.stdout.write(doctor.render(json.load(open(sys.argv[1]))))' \
    "$OUT/doctor-$layout.json" >> "$OUT/$layout.txt" 2>&1
done
echo "--- $OUT/summary.txt"; cat "$OUT/summary.txt"
