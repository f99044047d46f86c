# The flake's outputs, called with a nixpkgs that throws when touched: the output names (and
# per-system attribute names) must be listed without evaluating nixpkgs.
let
  flake = import ../../flake.nix;
  nixpkgs = throw "tests/nix/flake-outputs.nix: nixpkgs is not available offline";
  outputs = flake.outputs {
    self = outputs;
    inherit nixpkgs;
  };
  perSystem = attr: builtins.mapAttrs (_: builtins.attrNames) outputs.${attr};
in
{
  inputs = builtins.mapAttrs (_: i: i.url) flake.inputs;
  outputs = builtins.attrNames outputs;
  packages = perSystem "packages";
  apps = perSystem "apps";
  devShells = perSystem "devShells";
  checks = perSystem "checks";
  formatter = builtins.attrNames outputs.formatter;
  overlays = builtins.attrNames outputs.overlays;
  nixosModules = builtins.mapAttrs (_: m: baseNameOf (toString m)) outputs.nixosModules;
  lib = builtins.attrNames outputs.lib;
}
