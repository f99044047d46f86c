# torchcodec declares no dependencies; its libraries link libtorch/libc10, libpython3.12 and
# one FFmpeg major per core library (libtorchcodec_core4..8 link libavutil.so.56..60, readelf
# on the locked wheel) and it dlopens the core that matches the FFmpeg it finds. nixpkgs'
# FFmpeg satisfies one core; the other majors are left unresolved on purpose.
{
  lib,
  pkgs,
  python,
  packages,
  ...
}:
prev: {
  dependencies = prev.dependencies ++ [ packages.torch ];
  buildInputs = prev.buildInputs ++ [
    (lib.getLib pkgs.ffmpeg)
    python
  ];
  autoPatchelfIgnoreMissingDeps = prev.autoPatchelfIgnoreMissingDeps ++ [
    "libavcodec.so.*"
    "libavdevice.so.*"
    "libavfilter.so.*"
    "libavformat.so.*"
    "libavutil.so.*"
    "libswresample.so.*"
    "libswscale.so.*"
  ];
}
