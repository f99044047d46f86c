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
  # Each module is a function of the host's lib/pkgs: call it with just enough to see what it
  # imports and which defaults it sets (the package values themselves stay unevaluated).
  nixosModules = builtins.mapAttrs (
    _: m:
    let
      module = m {
        lib.mkDefault = v: v;
        pkgs.stdenv.hostPlatform.system = "x86_64-linux";
      };
    in
    {
      imports = map (i: baseNameOf (toString i)) module.imports;
      defaults = builtins.attrNames module.services.dflash;
    }
  ) outputs.nixosModules;
  lib = builtins.attrNames outputs.lib;
}
