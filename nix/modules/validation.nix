# Build-time validation of services.dflash.instances (`system.checks`), the rules written once in
# Python: everything that knows SGLang (flag mapping, rules, preflight) is in dflashctl, and a host
# whose instances it refuses does not build. No options of its own.
args@{ lib, pkgs, ... }:
let
  inherit (import ./shared.nix args)
    instances
    dflashctl
    pythonOf
    settingsFile
    allSettings
    ;

  # Step 1: every instance's settings and the rules across instances, with dflashctl alone
  # (seconds; no stack is built for it).
  settingsCheck = pkgs.runCommand "dflash-validate-settings" { } ''
    ${dflashctl} validate ${allSettings}
    touch $out
  '';
  # Step 2, only for DDTREE instances: the package's SGLang must offer it (a patched SGLang).
  packageCheck =
    name: i:
    pkgs.runCommand "dflash-validate-${name}-package" { } ''
      ${dflashctl} validate ${settingsFile name i} --python ${pythonOf i}
      touch $out
    '';
  ddtreeInstances = lib.filterAttrs (_: i: i.speculative.algorithm == "DDTREE") instances;
  # Step 3, where the models are store paths (so the build can read them): the target and its
  # drafter against each other and SGLang (`--models`: config, tokenizer, weights; exit 79 names
  # each mismatch). Hub models are checked by serve's preflight, from the instance's cache.
  modelsCheck =
    name: i:
    pkgs.runCommand "dflash-validate-${name}-models" { } ''
      ${dflashctl} validate ${settingsFile name i} --models
      touch $out
    '';
  inStore = p: p != null && lib.hasPrefix builtins.storeDir p;
  storeModelInstances = lib.filterAttrs (
    _: i: inStore i.model && (i.draftModel == null || inStore i.draftModel)
  ) instances;
in
{
  config = lib.mkIf (instances != { }) {
    system.checks = [
      settingsCheck
    ]
    ++ lib.mapAttrsToList packageCheck ddtreeInstances
    ++ lib.mapAttrsToList modelsCheck storeModelInstances;
  };
}
