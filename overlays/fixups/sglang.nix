# SGLang from the lock, patched, or swapped for another wheel: overlay arguments sglangPatches,
# sglangPatchFlags and sglangSrc (docs/nix.md shows DDTree as the example).
{
  lib,
  python,
  options,
  ...
}:
let
  inherit (options) sglangPatches sglangPatchFlags sglangSrc;
  wheel = (import ../../nix/lib).wheel;
in
prev:
lib.optionalAttrs (sglangSrc != null) {
  # Another sglang wheel (e.g. built from an upstream pull request with `uv build --wheel
  # python/`); it keeps the lock's dependencies. Its version comes from its file name.
  src = sglangSrc;
  version = (wheel.parts (baseNameOf (toString sglangSrc))).version;
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
