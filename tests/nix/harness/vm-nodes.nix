# checks.nixos-vm's hosts over the derivation stand-in of nixpkgs (tests/nix/closure-nixpkgs): per
# host, the derivations its configuration depends on, as tests/nix/harness/nixos-lite.nix finds them
# (what the stand-in's runNixOSTest puts in the check's closure) and, given a nixpkgs lib from
# outside the repository, as the real module system finds them (beside the minimal NixOS option
# declarations of tests/nix/harness/nixos-declarations.nix). tests/nix/test_nix_checks.py holds the two
# equal, which is what lets the offline closure stand for the real one.
#   nix eval --json --impure --expr 'import tests/nix/harness/vm-nodes.nix { lib = import <nixpkgs lib>; }'
{
  lib ? null,
  system ? "x86_64-linux",
}:
let
  flake = import ../../../flake.nix;
  outputs = flake.outputs {
    self = outputs // {
      outPath = "/stand-in/source";
    };
    nixpkgs.outPath = ../closure-nixpkgs;
  };
  pkgs =
    import ../closure-nixpkgs {
      inherit system;
      config.allowUnfreePredicate = outputs.lib.allowUnfreePredicate;
      overlays = [ outputs.overlays.default ];
    }
    // {
      testers.runNixOSTest = test: test;
    };
  test = import ../../../nix/vm-test.nix {
    inherit pkgs;
    self = outputs;
  };
  dependencies = s: builtins.sort (a: b: a < b) (builtins.attrNames (builtins.getContext s));
  lite =
    node:
    dependencies (
      builtins.concatStringsSep " "
        (import ./nixos-lite.nix {
          inherit pkgs;
          modules = [ node ];
        }).strings
    );
  real =
    node:
    let
      c =
        (lib.evalModules {
          specialArgs = {
            inherit pkgs;
            modulesPath = "/stand-in/nixos/modules";
          };
          modules = [
            (import ./nixos-declarations.nix lib)
            node
          ];
        }).config;
    in
    dependencies (
      builtins.toJSON {
        inherit (c.systemd) services tmpfiles;
        inherit (c.environment) etc systemPackages;
        inherit (c.system) checks;
        inherit (c) users networking;
      }
    );
  # The control: a host on the flake's module defaults, as a user's would be (the stack, the
  # kernels): both evaluators must find those in it.
  nodes = test.nodes // {
    flake-defaults = {
      imports = [ outputs.nixosModules.dflash ];
      services.dflash.instances.a = {
        model = "m";
        gpus = [ 0 ];
      };
    };
  };
in
builtins.mapAttrs (
  _: node:
  {
    lite = lite node;
  }
  // (if lib == null then { } else { real = real node; })
) nodes
