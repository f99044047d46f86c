# torch-memory-saver declares no dependencies; its hook libraries link libcudart.so.13 (from
# nvidia-cuda-runtime) and libcuda (the driver). The *_cu12 variants link libcudart.so.12,
# which a CUDA 13 stack never loads (readelf on the locked wheel).
{ packages, ... }:
prev: {
  dependencies = prev.dependencies ++ [ packages.nvidia-cuda-runtime ];
  autoPatchelfIgnoreMissingDeps = prev.autoPatchelfIgnoreMissingDeps ++ [ "libcudart.so.12" ];
}
