# sglang-kernel 0.4.2 declares no dependencies, yet its common_ops libraries link libtorch,
# libcudart/libcublas/libnvrtc (CUDA 13) and libnuma. torch brings the CUDA wheels into the
# search path; numactl brings libnuma.
{ pkgs, packages, ... }:
prev: {
  dependencies = prev.dependencies ++ [ packages.torch ];
  buildInputs = prev.buildInputs ++ [ pkgs.numactl ];
  # Not importable here: it picks sm90/ or sm100/ libraries from the GPU it finds.
}
