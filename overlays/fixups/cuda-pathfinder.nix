# cuda-pathfinder 1.5.4 (cuda-bindings and cuda-python load the CUDA libraries through it) finds
# the driver's libcuda.so.1 and libnvidia-ml.so.1 by name only ("system search"), which Nix's
# loader answers from LD_LIBRARY_PATH alone. On NixOS it also tries /run/opengl-driver/lib, as
# the nvidia-ml-py fix-up does; elsewhere dflashctl's driver discovery provides LD_LIBRARY_PATH.
{ python, driverLink, ... }:
prev: {
  postInstall = (prev.postInstall or "") + ''
    substituteInPlace $out/${python.sitePackages}/cuda/pathfinder/_dynamic_libs/load_dl_linux.py --replace-fail '
        candidates.append(f"lib{desc.name}.so")
        return candidates
    ' '
        candidates.append(f"lib{desc.name}.so")
        if desc.packaged_with == "driver":  # NixOS links the driver here
            candidates += [f"${driverLink}/lib/{s}" for s in reversed(desc.linux_sonames)]
        return candidates
    '
  '';
  pythonImportsCheck = [ "cuda.pathfinder" ];
}
