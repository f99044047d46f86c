# The flake's outputs evaluated over a stand-in nixpkgs (tests/nix/stub-nixpkgs): every
# per-system output is forced, so stderr shows how often nixpkgs was imported (the test counts
# the traces) and the result shows what each output got from it.
let
  flake = import ../../flake.nix;
  nixpkgs = {
    outPath = ./stub-nixpkgs;
    lib.nixosSystem =
      { system, ... }:
      {
        config.systemd.services.dflash-qwen3 = { };
        config.system.build.toplevel.drvPath = "/stub/nixos-${system}";
      };
  };
  outputs = flake.outputs {
    self = outputs;
    inherit nixpkgs;
  };
  perSystem = system: {
    packages = outputs.packages.${system};
    app = outputs.apps.${system}.dflash-smoke.program;
    devShell = outputs.devShells.${system}.default;
    formatter = outputs.formatter.${system};
    checks = outputs.checks.${system};
  };
in
builtins.listToAttrs (
  map (system: {
    name = system;
    value = perSystem system;
  }) (builtins.attrNames outputs.packages)
)
