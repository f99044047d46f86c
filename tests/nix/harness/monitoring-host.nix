# A host's services.prometheus and services.grafana as nix/module.nix sets them, through
# tests/nix/harness/nixos-lite.nix (no nixpkgs; tests/operations/test_monitoring.py reads the result):
#   nix-instantiate --eval --strict --json tests/nix/harness/monitoring-host.nix --argstr hostJSON '{...}'
# `hostJSON`: the host's configuration as JSON (services.dflash, services.prometheus, ...).
{ hostJSON }:
let
  package = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };
  pkgs = {
    lib = import ../../../nix/stand-in-lib.nix;
    dflash-env = package "dflash-env";
    dflashctl = package "dflashctl";
    dflashHostCompiler = package "gcc-wrapper";
    dflash-router-env = package "dflash-router-env";
    # What the module writes, readable back: the text itself stands in for the file.
    writeText = name: text: {
      type = "derivation";
      inherit name text;
      outPath = "/nix/store/11111111111111111111111111111111-${name}";
    };
    runCommand =
      name: _: script:
      package name // { inherit script; };
  };
  lite = import ./nixos-lite.nix {
    inherit pkgs;
    modules = [
      ../../../nix/module.nix
      (builtins.fromJSON hostJSON)
    ];
  };
  c = lite.config;
in
{
  inherit (lite) failedAssertions;
  prometheus = {
    scrapeConfigs = c.services.prometheus.scrapeConfigs;
    ruleFiles = map (f: {
      inherit (f) name;
      rules = builtins.fromJSON f.text;
    }) c.services.prometheus.ruleFiles;
  };
  grafana = {
    provision = c.services.grafana.provision.enable;
    providers = map (p: {
      inherit (p) name;
      script = p.options.path.script;
    }) c.services.grafana.provision.dashboards.settings.providers;
  };
}
