# torch 2.11.0, the CUDA 13.0 build. Its CUDA libraries (libcudart, libcublas, libcudnn,
# libnccl, libnvshmem, ...) come from the locked nvidia-* wheels, found by the generic search
# path; the driver's libcuda comes from the host at run time.
{ ... }:
prev: {
  # Fails the build, not the service start, when a CUDA library was not found by autoPatchelf
  # or torch's own loader (torch imports without a GPU).
  pythonImportsCheck = [ "torch" ];
}
