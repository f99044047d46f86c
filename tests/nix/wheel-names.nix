# Wheel file names -> fetchPypi arguments, and back: fetchPypi must ask for the same file.
let
  inherit (import ../../nix/lib) wheel;
  files = [
    "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    "triton-3.6.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_aarch64.whl"
    "soundfile-0.13.1-py2.py3-none-manylinux_2_28_x86_64.whl"
    "flashinfer_python-0.6.8.post1-py3-none-any.whl"
    "build_tagged-1.0-2-py3-none-any.whl"
  ];
  one =
    file:
    let
      args = wheel.fetchPypiArgs {
        inherit file;
        sha256 = "0000000000000000000000000000000000000000000000000000000000000000";
      };
    in
    {
      inherit file args;
      roundTrip = wheel.fetchedName args == file;
    };
in
map one files
