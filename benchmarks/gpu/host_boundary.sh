#!/usr/bin/env bash
# The host-boundary evidence in one device call (issues 14 and 15), from the repo root:
#   bash benchmarks/gpu/host_boundary.sh
#   1. driver_discovery.sh: the loader made as blind as a Nix-built Python's, before/after discovery
#   2. doctor_abi.sh: an sgl_kernel built for another torch in front of the stack (demangled symbol)
#   3. gpu_busy.sh: another process holding the GPU; NVML recorded for the tests
#   4. serve under the NixOS-layout emulation: READY=1 through driver discovery alone
# Each part writes its files into one tar.gz in $OUT (the device returns at most 8 files) and its
# summary to stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/common.sh
stack_setup || exit 3
OUT=${OUT:-/tmp/host-boundary-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
parts=/tmp/host-boundary-parts; rm -rf "$parts"; mkdir -p "$parts"
ms() { echo $(( $(date +%s%N) / 1000000 )); }

part() {  # $1 name, then the command; its OUT is its own folder, packed afterwards
  local name=$1; shift
  local t0=$(ms)
  echo "===================== $name"
  mkdir -p "$parts/$name"
  OUT=$parts/$name "$@" >"$parts/$name/stdout.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc after $(( ($(ms) - t0) / 1000 )) s"
  tail -n "${TAIL:-40}" "$parts/$name/stdout.txt" | cut -c1-400
  tar -C "$parts" -czf "$OUT/$name.tar.gz" "$name"
}

TAIL=60 part driver-discovery bash benchmarks/gpu/driver_discovery.sh
TAIL=45 part doctor-abi bash benchmarks/gpu/doctor_abi.sh
TAIL=30 part gpu-busy bash benchmarks/gpu/gpu_busy.sh
# serve.sh's served instance, the whole driver process inside the NixOS-layout emulation: serve's
# discovery must find /run/opengl-driver/lib and hand it to SGLang.
TAIL=30 SERVE_ONLY=1 part serve-nixos bash benchmarks/gpu/nix_loader_emulation.sh nixos \
  bash benchmarks/gpu/serve.sh
ls -la "$OUT"
