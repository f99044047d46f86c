# A stand-in for nixpkgs (tests/nix/flake-imports.nix): `import nixpkgs { ... }` returns just
# enough of a package set for the flake's outputs to evaluate, and traces every import so a
# test can count them. The packages are strings; nothing is built.
{
  system,
  config ? { },
  overlays ? [ ],
}:
builtins.trace "stub nixpkgs imported for ${system}" {
  inherit system config;
  lib = {
    escapeShellArg = s: "'${s}'";
    hasInfix = infix: s: builtins.match ".*${infix}.*" s != null;
  };
  dflash-env = "dflash-env-${system}";
  dflashctl = "dflashctl-${system}";
  nixfmt-tree = "nixfmt-tree-${system}";
  nixfmt = "nixfmt";
  git = "git";
  python312.withPackages = _: "python312-env";
  callPackage = fn: _: "callPackage ${baseNameOf (toString fn)}";
  writeShellScript = name: _: "/stub/${name}";
  writeText = name: _: "/stub/${name}";
  runCommand =
    name: _: _:
    "/stub/${name}";
}
