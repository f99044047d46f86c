# nvidia-cuda-nvcc: nvcc reads bin/nvcc.profile and finds cicc, libdevice, the CUDA headers and
# libcudart relative to its own real path (TOP = bin/..). In one pip site-packages every
# nvidia/cu13 wheel shares that tree; in the store each wheel is its own path, so the profile is
# pointed at the other CUDA wheels (nvvm: cicc + libdevice; crt, cuda-runtime, cccl: headers).
# SGLang compiles its JIT kernels (tvm-ffi, flashinfer) with this nvcc at first start.
{ python, packages, ... }:
prev:
let
  cu13 = p: "${p}/${python.sitePackages}/nvidia/cu13";
  nvvm = cu13 packages.nvidia-nvvm;
in
{
  dependencies = prev.dependencies ++ [
    packages.nvidia-nvvm
    packages.nvidia-cuda-crt
    packages.nvidia-cuda-runtime
    packages.nvidia-cuda-cccl
  ];
  postInstall = (prev.postInstall or "") + ''
    profile=$out/${python.sitePackages}/nvidia/cu13/bin/nvcc.profile
    substituteInPlace $profile \
      --replace-fail 'CICC_PATH        = $(TOP)/nvvm/bin' 'CICC_PATH        = ${nvvm}/nvvm/bin' \
      --replace-fail 'NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice' 'NVVMIR_LIBRARY_DIR = ${nvvm}/nvvm/libdevice'
    cat >> $profile <<'PROFILE'
    INCLUDES        +=  "-I${cu13 packages.nvidia-cuda-runtime}/include" "-I${cu13 packages.nvidia-cuda-crt}/include" $(_SPACE_)
    SYSTEM_INCLUDES +=  "-isystem" "${cu13 packages.nvidia-cuda-cccl}/include/cccl" $(_SPACE_)
    LIBRARIES        =+ $(_SPACE_) "-L${cu13 packages.nvidia-cuda-runtime}/lib"
    PROFILE
    chmod +x $out/${python.sitePackages}/nvidia/cu13/bin/*
  '';
}
