# nvidia-ml-py 13.595.45 (pynvml) loads NVML by name, `CDLL("libnvidia-ml.so.1")`. Nix's loader
# never searches the host's library directories, so on NixOS SGLang's nvmlInit() (tensor
# parallelism, NUMA) and flashinfer's find no driver. As nixpkgs does for its own nvidia-ml-py,
# a failed load falls back to the driver NixOS links at /run/opengl-driver/lib. Other hosts: the
# first attempt finds the libraries dflashctl's driver discovery put on LD_LIBRARY_PATH.
{ python, driverLink, ... }:
prev: {
  postInstall = (prev.postInstall or "") + ''
    substituteInPlace $out/${python.sitePackages}/pynvml.py --replace-fail '
                            nvmlLib = CDLL("libnvidia-ml.so.1")
    ' '
                            try:
                                nvmlLib = CDLL("libnvidia-ml.so.1")
                            except OSError:
                                nvmlLib = CDLL("${driverLink}/lib/libnvidia-ml.so.1")  # NixOS
    '
  '';
  pythonImportsCheck = [ "pynvml" ];
}
