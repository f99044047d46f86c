# The generic rule: one locked wheel -> one buildPythonPackage. It names no package; a
# package's quirks live in overlays/fixups/<name>.nix, which receives these arguments and
# returns the ones it changes.
{
  lib,
  python,
  fetchPypi,
  stdenv,
  zlib,
  autoPatchelfHook,
  autoAddDriverRunpath,
}:
{
  entry, # one value of nix/lib lock.packagesFor
  dependencies, # the packages of entry.dependencies
  fixup ? (_: { }),
}:
let
  nixLib = import ../nix/lib;

  # Driver libraries come from the host's NVIDIA driver at run time (/run/opengl-driver/lib,
  # added to every runpath by autoAddDriverRunpath), never from the store.
  driverLibraries = [
    "libcuda.so.1"
    "libnvidia-ml.so.1"
  ];

  base = {
    pname = entry.name;
    inherit (entry) version;
    # The two hooks `format = "wheel"` would add, without the third: that format also gets
    # pythonOutputDistHook, a `dist` output holding the wheel again (3.6 GiB per system).
    pyproject = false;
    src = fetchPypi entry.fetchPypi;
    inherit dependencies;
    nativeBuildInputs = [
      python.pkgs.wheelUnpackHook # unpackPhase: the wheel into dist/
      python.pkgs.pypaInstallHook # installPhase: dist/*.whl into $out
      autoPatchelfHook
      autoAddDriverRunpath
    ];
    # What manylinux wheels may take from the system: libstdc++/libgcc_s and zlib.
    buildInputs = [
      stdenv.cc.cc.lib
      zlib
    ];
    autoPatchelfIgnoreMissingDeps = driverLibraries;
    # Locked bytes stay as published; stripping prebuilt CUDA libraries has broken them before.
    dontStrip = true;
    passthru.lockEntry = entry;
    # From the wheel's metadata via the lock: NVIDIA's wheels are unfree, so nixpkgs builds them
    # only where the host allows them (flake.nix: dflash.lib.allowUnfreePredicate).
    meta.license = nixLib.license.meta lib entry.license;
  };

  args = base // fixup base;

  # The wheels this one's ELF files may link against (libcudart from nvidia-cuda-runtime,
  # libtorch from torch, ...): every Python package in its dependency closure, fix-up
  # additions included. autoPatchelf then writes their store paths into the runpaths.
  closure = python.pkgs.requiredPythonModules args.dependencies;
  searchPath = map (p: "${p}/${python.sitePackages}") closure;
in
python.pkgs.buildPythonPackage (
  args
  // {
    # Libraries that dlopen their siblings by name rely on $ORIGIN, which autoPatchelf drops
    # when it rewrites a runpath. Put it back as the last postFixup hook: after autoPatchelf and
    # autoAddDriverRunpath (registered there when their setup hooks were sourced) and before
    # pythonImportsCheck (a preDistPhase), so the import checks load the final runpaths.
    preFixup = ''
      for dir in ${lib.escapeShellArgs searchPath}; do
        [ -d "$dir" ] && addAutoPatchelfSearchPath "$dir"
      done
      keepOriginRunpath() {
        find "$out" -type f \( -name '*.so' -o -name '*.so.*' \) -print0 |
          while IFS= read -r -d "" elf; do
            patchelf --add-rpath '$ORIGIN' "$elf" 2>/dev/null || true
          done
      }
      postFixupHooks+=(keepOriginRunpath)
    ''
    + (args.preFixup or "");
  }
)
