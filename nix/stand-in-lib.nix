# The few nixpkgs `lib` functions overlays/ and the fix-ups call, with nixpkgs' semantics, so
# `dflashctl audit` (nix/audit.nix) and the offline tests (tests/nix/) evaluate them without nixpkgs.
{
  escapeShellArgs = l: builtins.concatStringsSep " " (map (s: "'${s}'") l);
  escapeShellArg = s: "'${s}'";
  optionalAttrs = cond: attrs: if cond then attrs else { };
  optionalString = cond: s: if cond then s else "";
  hasSuffix =
    suffix: s:
    let
      ls = builtins.stringLength s;
      lx = builtins.stringLength suffix;
    in
    ls >= lx && builtins.substring (ls - lx) lx s == suffix;
  remove = e: builtins.filter (x: x != e);
  getLib = p: p;
  makeExtensible =
    f:
    let
      self = f self;
    in
    self;
  licenses = {
    nvidiaCudaRedist = { };
    unfree = { };
  };
  getLicenseFromSpdxIdOr = _: default: default;
}
