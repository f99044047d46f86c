# A stand-in for nixpkgs (`import nixpkgs { overlays = ...; }`) with only what the flake's smoke
# app reads: the real overlay is applied over a base of gcc14, writeShellScript and callPackage.
# The directories standing in for the compiler and dflash-env come from the environment
# (DFLASH_STUB_COMPILER, DFLASH_STUB_ENV; evaluate with --impure), so a test can run the app.
{ overlays, ... }:
let
  env = builtins.getEnv "DFLASH_STUB_ENV";
  base = {
    gcc14 = {
      name = "gcc-wrapper-14-stub";
      outPath = builtins.getEnv "DFLASH_STUB_COMPILER";
    };
    writeShellScript = name: text: builtins.toFile name "#!/usr/bin/env bash\n${text}";
    callPackage = path: _: {
      outPath = if baseNameOf path == "dflash-env.nix" then env else "/nonexistent";
    };
  };
  final = base // (builtins.head overlays) final base;
in
final
