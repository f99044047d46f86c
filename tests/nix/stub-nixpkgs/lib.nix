# The few nixpkgs `lib` functions overlays/build-wheel.nix and the fix-ups call, with nixpkgs'
# semantics, so tests/nix/build-wheel.nix can evaluate them without nixpkgs.
{
  escapeShellArgs = l: builtins.concatStringsSep " " (map (s: "'${s}'") l);
  optionalAttrs = cond: attrs: if cond then attrs else { };
  hasSuffix =
    suffix: s:
    let
      ls = builtins.stringLength s;
      lx = builtins.stringLength suffix;
    in
    ls >= lx && builtins.substring (ls - lx) lx s == suffix;
  remove = e: builtins.filter (x: x != e);
  makeExtensible =
    f:
    let
      self = f self;
    in
    self;
}
