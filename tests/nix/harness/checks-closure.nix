# The flake's checks over the derivation stand-in of nixpkgs (tests/nix/closure-nixpkgs), per
# system: the .drv path of every check, and of the packages that do need the stack (the controls a
# test holds the checks against). tests/nix/test_nix_checks.py lists each one's dependency derivations
# with `nix-store --query --requisites`.
#   nix eval --json --impure --expr 'import tests/nix/harness/checks-closure.nix'
let
  flake = import ../../../flake.nix;
  nixpkgs = {
    outPath = ../closure-nixpkgs;
    # checks.nixos-example evaluates a host and keeps only names (no store dependency).
    lib.nixosSystem =
      { system, ... }:
      {
        config.systemd.services.dflash-qwen3 = { };
        config.system.build.toplevel.drvPath = "/stand-in/nixos-${system}";
      };
  };
  outputs = flake.outputs {
    self = outputs // {
      outPath = "/stand-in/source"; # the flake's source: a path, no derivation
    };
    inherit nixpkgs;
  };
  drvs = builtins.mapAttrs (_: d: d.drvPath);
in
builtins.mapAttrs (system: checks: {
  checks = drvs checks;
  packages = drvs (
    removeAttrs outputs.packages.${system} [ "default" ]
    // {
      dflash-env-tests-bytecode = outputs.packages.${system}.dflash-env.tests.bytecode;
    }
  );
}) outputs.checks
