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
  # The unfree rule the flake gave this import, visible in the output.
  dflash-env =
    "dflash-env-${system}"
    + (
      if config ? allowUnfreePredicate then
        " (unfree allowed: nvidia-cublas ${
           builtins.toJSON (config.allowUnfreePredicate { pname = "nvidia-cublas"; })
         }, torch ${builtins.toJSON (config.allowUnfreePredicate { pname = "torch"; })})"
      else if config.allowUnfree or false then
        " (unfree allowed: all)"
      else
        ""
    );
  dflashctl = "dflashctl-${system}";
  dflash-router-env = "dflash-router-env-${system}";
  dflashHostCompiler = "gcc14-${system}";
  dflash-kernels = "dflash-kernels-${system}";
  nixfmt-tree = "nixfmt-tree-${system}";
  nixfmt = "nixfmt";
  git = "git";
  python312.withPackages = _: "python312-env";
  callPackage = fn: _: "callPackage ${baseNameOf (toString fn)}";
  writeShellScript = name: _: "/stub/${name}";
  writeShellScriptBin = name: _: "/stub/${name}";
  python3.interpreter = "/stub/python3";
  curl = "curl";
  stdenv.hostPlatform.system = system;
  testers.runNixOSTest = test: "nixos-test ${test.name}";
  writeText = name: _: "/stub/${name}";
  runCommand =
    name: _: _:
    "/stub/${name}";
}
