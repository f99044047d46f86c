# torchaudio declares no dependencies, yet its extension libraries link libtorch, libc10 and
# libcudart.so.13 (checked with readelf on the locked wheel): torch brings them, and the CUDA
# wheels, into the autoPatchelf search path. Without it autoPatchelf fails the build.
{ packages, ... }:
prev: {
  dependencies = prev.dependencies ++ [ packages.torch ];
}
