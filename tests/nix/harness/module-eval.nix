# nix/module.nix through the module system of a nixpkgs lib found outside the repository (never
# committed; tests/nix/test_module_eval.py skips without one), next to option declarations of our own
# for the few NixOS options the module sets. They are minimal, written from the NixOS manual
# (e.g. `isNormalUser` puts a user in the group "users"): enough to see the module's option types
# refuse values, a host's definitions win over the module's mkDefault ones, its wiring reach
# `systemd.services` as nix/lib/service-unit.nix gave it, and what NixOS itself adds to a unit (PATH,
# systemd.globalEnvironment) reach its digest. The real NixOS is tier 2 (checks.nixos-vm).
#   nix-instantiate --eval --strict --json tests/nix/harness/module-eval.nix --arg lib 'import <lib>' \
#     --argstr instancesJSON '{"a": {"model": "m"}}' [--arg host 'import ./host.nix']
{
  lib,
  instancesJSON,
  routerJSON ? "{}",
  host ? { },
}:
let
  inherit (lib) mkOption types;
  package = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };
  pkgs = {
    dflash-env = package "dflash-env";
    dflashctl = package "dflashctl" // {
      meta.mainProgram = "dflashctl";
    };
    dflashHostCompiler = package "gcc-wrapper";
    dflash-router-env = package "dflash-router-env";
    writeText = name: _: "/nix/store/11111111111111111111111111111111-${name}";
    runCommand =
      name: _: _:
      package name;
  };
  declarations = import ./nixos-declarations.nix lib;
  c =
    (lib.evalModules {
      specialArgs = { inherit pkgs; };
      modules = [
        ../../../nix/module.nix
        declarations
        host
        {
          services.dflash.instances = builtins.fromJSON instancesJSON;
          services.dflash.router = builtins.fromJSON routerJSON;
        }
      ];
    }).config;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);
  inherit (c) warnings;
  services = lib.filterAttrs (n: _: lib.hasPrefix "dflash-" n) c.systemd.services;
  inherit (c.systemd) globalEnvironment;
  tmpfiles = c.systemd.tmpfiles.rules;
  users = c.users.users;
  groups = builtins.attrNames c.users.groups;
  firewall = c.networking.firewall.allowedTCPPorts;
  checks = map (d: d.name) c.system.checks;
  etc = builtins.mapAttrs (_: e: e.source) c.environment.etc;
  prometheus = {
    inherit (c.services.prometheus) scrapeConfigs ruleFiles;
  };
  grafanaProviders = c.services.grafana.provision.dashboards.settings.providers;
  monitoringOptions = c.services.dflash.prometheus;
}
