# triton 3.6.0 compiles a small C launcher per kernel at run time and links it against the
# driver's libcuda. Upstream finds libcuda with `/sbin/ldconfig -p` and the compiler on PATH;
# a NixOS host has neither, so both get a default here. TRITON_LIBCUDA_PATH and CC still win.
{
  pkgs,
  python,
  driverLink,
  ...
}:
prev: {
  postInstall = (prev.postInstall or "") + ''
    triton=$out/${python.sitePackages}/triton
    substituteInPlace $triton/backends/nvidia/driver.py --replace-fail \
      'if env_libcuda_path := knobs.nvidia.libcuda_path:' \
      'if env_libcuda_path := knobs.nvidia.libcuda_path or next((d for d in ["${driverLink}/lib"] if os.path.exists(d + "/libcuda.so.1")), None):'
    substituteInPlace $triton/runtime/build.py --replace-fail \
      'cc = os.environ.get("CC")' \
      'cc = os.environ.get("CC", "${pkgs.dflashHostCompiler}/bin/cc")'
    # ptxas, cuobjdump and nvdisasm ship without the executable bit in some wheel installs.
    chmod +x $triton/backends/nvidia/bin/*
  '';
  pythonImportsCheck = [ "triton" ];
}
