#!/usr/bin/env bash
# SGLang's JIT kernels compiled by the stack's own nvcc wheels, with no host toolkit in reach: the
# default smoke with CUDA_HOME/CUDA_PATH unset, every */cuda* directory off PATH and a fresh HOME
# (empty JIT caches), so dflashctl's cuda_home.provide must build CUDA_HOME from
# site-packages/nvidia/cu13 and nvcc must compile SGLang's tvm-ffi kernels from there.
# Needs the locked wheels unpacked at /tmp/site (common.sh's stack_setup, from .gpu or an earlier call on
# the same warm machine) and the CUDA compiler wheels (nvidia-cuda-nvcc, -crt, -runtime, -cccl, nvidia-nvvm;
# libnvvm.so dropped, unused by nvcc) as .cuda/cuda.tar.xz. Writes summary.txt and smoke.json to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/jit-out}; mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
stack_setup || exit 3
mkdir -p /tmp/cuda && xz -d -T4 <.cuda/cuda.tar.xz | tar -x -C /tmp/cuda
chmod +x /tmp/cuda/nvidia/cu13/bin/* /tmp/cuda/nvidia/cu13/nvvm/bin/*  # as pip sets them; zip extraction does not
# Hide the host's toolkit too (tvm-ffi falls back to /usr/local/cuda when CUDA_HOME is unset).
[ -e /usr/local/cuda ] && mv /usr/local/cuda /usr/local/cuda.hidden-by-jit-test
export PYTHONPATH=/tmp/cuda:/tmp/site:$PWD/python PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PATH=$(echo "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)
unset CUDA_HOME CUDA_PATH
export HOME=/tmp/jit-home; rm -rf "$HOME"; mkdir -p "$HOME"
summary=$OUT/summary.txt
{
  echo "nvcc on PATH: $(command -v nvcc || echo none); /usr/local/cuda: $(ls -d /usr/local/cuda 2>/dev/null || echo absent)"
  python3 -c 'import os, sys; from dflashctl.host import cuda_home; print("CUDA_HOME given to SGLang:", cuda_home.provide(dict(os.environ), sys.executable).get("CUDA_HOME"))'
} 2>&1 | tee "$summary"
if [ "${1:-smoke}" = flashinfer-norm ]; then  # the quick check: one flashinfer JIT module, ~40 s
  t0=$(date +%s)
  python3 - <<'PY' 2>&1 | tail -n 20 | tee -a "$summary"
import os, sys, torch
from dflashctl.host import cuda_home
os.environ.update(cuda_home.provide(dict(os.environ), sys.executable))
from flashinfer.norm import rmsnorm
x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
err = (rmsnorm(x, w, eps=1e-6).float() - ref).abs().max().item()
print(f"flashinfer rmsnorm JIT-compiled by {os.environ['CUDA_HOME']}/bin/nvcc: max abs error {err:.4f}")
PY
  echo "flashinfer-norm: $(( $(date +%s) - t0 )) s; JIT modules in the fresh HOME: $(find "$HOME/.cache" -name '*.so' | wc -l)" | tee -a "$summary"
  exit 0
fi
t0=$(date +%s)
timeout -k 5 300 python3 -m dflashctl smoke --work-dir /tmp/jit-work --json "$OUT/smoke.json" >/tmp/jit-smoke.out 2>&1
rc=$?
echo "smoke: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$summary"
grep -vE '^\[smoke\]' /tmp/jit-smoke.out | head -n 12 | tee -a "$summary"
echo "JIT modules compiled into the fresh HOME: $(find "$HOME/.cache" -name '*.so' | wc -l)" | tee -a "$summary"
ls "$HOME/.cache/tvm-ffi" 2>/dev/null | head -n 8 | tee -a "$summary"
if [ "$rc" != 0 ]; then
  for f in /tmp/jit-work/logs/*.log; do echo "== $f"; grep -nE 'nvcc|CUDA_HOME|rror' "$f" | tail -n 25; done | tee -a "$summary"
fi
