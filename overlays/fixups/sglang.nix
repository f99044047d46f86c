# SGLang from the lock, patched, or swapped: overlay arguments sglangPatches, sglangPatchFlags
# and sglangSrc (docs/nix.md shows DDTree as the example).
{
  lib,
  python,
  options,
  ...
}:
let
  inherit (options) sglangPatches sglangPatchFlags sglangSrc;
  nixLib = import ../../nix/lib;
  # A derivation (fetchurl) names its file in `name`; a path is its own name.
  srcName = if sglangSrc ? name then sglangSrc.name else baseNameOf (toString sglangSrc);
  isWheel = sglangSrc != null && lib.hasSuffix ".whl" srcName;
  isTree = sglangSrc != null && !isWheel;
  # Reading a fetched tree's pyproject.toml imports from a derivation (allowed by default).
  tree = nixLib.pyproject.read "${sglangSrc}/python/pyproject.toml";
in
prev:
lib.optionalAttrs isWheel {
  # Another sglang wheel (e.g. built from an upstream pull request with `uv build --wheel
  # python/`); it keeps the lock's dependencies. Its version comes from its file name.
  src = sglangSrc;
  version = (nixLib.wheel.parts srcName).version;
}
// lib.optionalAttrs isTree {
  # A checkout of the upstream repository: its python/ directory is built with its own
  # pyproject (PEP 517), keeping the lock's dependencies. A dynamic version falls back to the
  # lock's.
  src = sglangSrc;
  pyproject = true;
  version = if tree.version != null then tree.version else prev.version;
  postUnpack = (prev.postUnpack or "") + ''
    sourceRoot=$sourceRoot/python
  '';
  build-system = map (name: python.pkgs.${name}) tree.buildSystem;
  # pyproject = true brings the PEP 517 build and install hooks; the wheel's unpack hook
  # would copy the tree as if it were a wheel file.
  nativeBuildInputs = lib.remove python.pkgs.wheelUnpackHook (
    lib.remove python.pkgs.pypaInstallHook prev.nativeBuildInputs
  );
}
// lib.optionalAttrs (sglangPatches != [ ]) {
  # A wheel has no source tree to patch, so the installed files are patched; upstream patches
  # say a/python/sglang/..., installed files are sglang/..., hence the default -p2.
  postInstall = (prev.postInstall or "") + ''
    pushd $out/${python.sitePackages} >/dev/null
    for p in ${lib.escapeShellArgs (map (p: "${p}") sglangPatches)}; do
      echo "applying $p to sglang"
      patch ${lib.escapeShellArgs sglangPatchFlags} --forward --batch < "$p"
    done
    # Byte code compiled before the patch would be stale; rebuild it from the patched files.
    ${python.interpreter} -m compileall -q -f --invalidation-mode checked-hash sglang >/dev/null
    popd >/dev/null
  '';
}
