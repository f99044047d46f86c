# nix/module.nix inside our reduced NixOS (systemd.nix, users.nix, assertions.nix, misc.nix),
# evaluated with nixpkgs' lib alone. Used by tests/module_harness.py:
#   nix-instantiate --eval --strict --json --read-write-mode tests/nixos/eval.nix \
#     --arg lib 'import <nixpkgs-lib>/lib' --argstr instancesJSON '{"a": {"model": "m"}}' \
#     --argstr harness /dir/with/dflashctl-and-envs [--arg host 'import ./host.nix'] [--arg flake true]
# As NixOS does, failed assertions stop everything else; otherwise the rendered unit files and
# what else the module defines come out. Packages are real directories under `harness` (so the
# checks' scripts and `systemd-analyze verify` can run them) with their paths as outPath.
{
  lib,
  instancesJSON,
  harness,
  host ? { },
  flake ? false,
}:
let
  system = "x86_64-linux";
  pkg = name: outPath: {
    type = "derivation";
    inherit name outPath;
    meta.mainProgram = name;
  };
  fake = name: pkg name "/nix/store/00000000000000000000000000000000-${name}";
  pkgs = {
    stdenv.hostPlatform.system = system;
    stdenv.cc = fake "gcc-wrapper";
    dflashHostCompiler = fake "gcc-wrapper-14"; # the overlay's pinned host compiler
    coreutils = fake "coreutils";
    findutils = fake "findutils";
    gnugrep = fake "gnugrep";
    gnused = fake "gnused";
    systemd = fake "systemd";
    dflashctl = pkg "dflashctl" "${harness}/dflashctl";
    dflash-env = pkg "dflash-env" "${harness}/env-release"; # SGLang 0.5.11: no DDTREE
    dflash-env-ddtree = pkg "dflash-env-ddtree" "${harness}/env-ddtree"; # a patched SGLang
    writeText = builtins.toFile; # a real store file: the tests read and validate it
    runCommand =
      name: env: script:
      pkg name "/nix/store/22222222222222222222222222222222-${name}" // { inherit script; };
  };
  flakeModule =
    ((import ../../flake.nix).outputs {
      self.packages.${system} = {
        dflash-env = pkg "flake-dflash-env" "${harness}/env-release";
        dflashctl = pkg "dflashctl" "${harness}/dflashctl";
        dflash-host-compiler = fake "flake-gcc-wrapper-14";
      };
      nixpkgs = throw "nixpkgs is not needed to evaluate the module";
    }).nixosModules.dflash;
  eval = lib.evalModules {
    specialArgs = { inherit pkgs; };
    modules = [
      (if flake then flakeModule else ../../nix/module.nix)
      ./assertions.nix
      ./systemd.nix
      ./users.nix
      ./misc.nix
      host
      { services.dflash.instances = builtins.fromJSON instancesJSON; }
    ];
  };
  c = eval.config;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  dflashUnits = lib.filterAttrs (n: _: lib.hasPrefix "dflash-" n) c.systemd.units;
in
if failedAssertions != [ ] then
  { inherit failedAssertions; }
else
  {
    failedAssertions = [ ];
    inherit (c) warnings;
    units = lib.mapAttrs (_: u: u.text) dflashUnits;
    wantedBy = lib.mapAttrs (_: u: u.wantedBy) dflashUnits;
    checks = map (d: { inherit (d) name script; }) c.system.checks;
    tmpfiles = c.systemd.tmpfiles.rules;
    users = lib.mapAttrs (_: u: {
      inherit (u)
        isSystemUser
        isNormalUser
        group
        uid
        ;
    }) c.users.users;
    groups = lib.attrNames c.users.groups;
    firewall = c.networking.firewall.allowedTCPPorts;
  }
