# Evaluates nix/module.nix with nixpkgs' lib alone (no nixpkgs package set): the NixOS options it
# touches are stubbed, packages are fake store paths. Used by tests/test_unit_module.py.
#   nix-instantiate --eval --read-write-mode --strict --json eval-module.nix --arg lib 'import <nixpkgs.lib>/lib' \
#     --arg instances 'import ./instances.nix'
# With `flake = true` the flake's nixosModules.dflash (the wrapper that defaults the packages to the
# flake's own) is evaluated instead, with a fake `self`; `top` is more top-level module config.
{
  lib,
  instances,
  flake ? false,
  top ? { },
}:
let
  fakePkg = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };
  system = "x86_64-linux";
  fakeSelf = {
    packages.${system} = {
      dflash-env = fakePkg "flake-dflash-env";
      dflashctl = fakePkg "flake-dflashctl";
      dflash-host-compiler = fakePkg "flake-gcc-wrapper";
    };
  };
  flakeModule =
    ((import ../../../flake.nix).outputs {
      self = fakeSelf;
      nixpkgs = throw "nixpkgs is not needed to evaluate the module";
    }).nixosModules.dflash;
  pkgs = {
    stdenv.hostPlatform.system = system;
    dflashHostCompiler = fakePkg "gcc-wrapper";
    dflash-env = fakePkg "dflash-env";
    dflashctl = fakePkg "dflashctl";
    writeText = builtins.toFile; # a real file in the store, so the test can validate it
    runCommand = name: env: script: {
      inherit name script;
      outPath = "/nix/store/22222222222222222222222222222222-${name}";
    };
  };
  stubs = {
    options = with lib; {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      system.checks = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      systemd.services = mkOption {
        type = types.lazyAttrsOf types.anything;
        default = { };
      };
      users = mkOption {
        type = types.anything;
        default = { };
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
    };
  };
  eval = lib.evalModules {
    specialArgs = { inherit pkgs; };
    modules = [
      (if flake then flakeModule else ../../../nix/module.nix)
      stubs
      top
      { services.dflash.instances = instances; }
    ];
  };
  c = eval.config;
in
{
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  services = c.systemd.services;
  users = c.users;
  firewall = c.networking.firewall.allowedTCPPorts;
  checks = map (d: { inherit (d) name script; }) c.system.checks;
  options = builtins.attrNames (eval.options.services.dflash.instances.type.getSubOptions [ ]);
}
