# Wheel file names (PEP 427) -> the arguments nixpkgs' fetchPypi takes for the wheel form.
let
  # name-version(-build)?-python-abi-platform.whl; the platform part may be compressed
  # (manylinux_2_27_x86_64.manylinux_2_28_x86_64), so it is everything after the abi.
  parts =
    file:
    let
      m = builtins.match "([^-]+)-([^-]+)(-([0-9][^-]*))?-([^-]+)-([^-]+)-([^-]+)\\.whl" file;
    in
    if m == null then
      throw "dflash: ${file} is not a wheel file name (name-version-python-abi-platform.whl)"
    else
      {
        distribution = builtins.elemAt m 0;
        version = builtins.elemAt m 1;
        build = builtins.elemAt m 3;
        python = builtins.elemAt m 4;
        abi = builtins.elemAt m 5;
        platform = builtins.elemAt m 6;
      };
in
{
  inherit parts;

  # fetchPypi rebuilds the file name as "${pname}-${version}-${python}-${abi}-${platform}.whl"
  # and the index directory from `dist`, so pname is the file's distribution part (underscores
  # kept) and a build tag, when present, rides on the version.
  fetchPypiArgs =
    { file, sha256 }:
    let
      p = parts file;
    in
    {
      pname = p.distribution;
      version = if p.build == null then p.version else "${p.version}-${p.build}";
      format = "wheel";
      inherit (p) python abi platform;
      dist = p.python;
      inherit sha256;
    };

  # The file name fetchPypi will ask for; equal to `file` for every valid wheel name.
  fetchedName = a: "${a.pname}-${a.version}-${a.python}-${a.abi}-${a.platform}.whl";
}
