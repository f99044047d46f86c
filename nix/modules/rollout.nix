# services.dflash.upgrade and .rollout: what `nixos-rebuild switch` does with instances whose unit
# changed, and with upgrade = "rolling" the whole mechanism of it (below, under `config`): the
# instances left running by the switch, dflash-rollout.service started by it, its triggers. The
# rollout unit is a pure function in ../lib/rollout-unit.nix (tier 1 evaluates it without nixpkgs).
args@{ lib, ... }:
let
  inherit (lib) mkOption types literalExpression;
  inherit (import ./shared.nix args)
    cfg
    instances
    dflashctl
    unitName
    allSettings
    instanceEntry
    routerSettingsPath
    ;
  rolloutUnit = import ../lib/rollout-unit.nix;
  serviceEntry = import ../lib/service-entry.nix;
  defaults = rolloutUnit.data.defaults;

  rolloutEntry = rolloutUnit.entry {
    inherit dflashctl instances;
    instancesFile = "${allSettings}";
    routerSettingsFile = if cfg.router.enable then routerSettingsPath else null;
    instanceEntries = lib.mapAttrs instanceEntry instances;
    inherit (cfg) rollout;
  };
in
{
  options.services.dflash = {
    upgrade = mkOption {
      type = types.enum [
        "rolling"
        "restart"
      ];
      default = if cfg.router.enable then "rolling" else "restart";
      defaultText = literalExpression ''if config.services.dflash.router.enable then "rolling" else "restart"'';
      description = ''
        What `nixos-rebuild switch` does with instances whose unit changed (a new stack, a changed
        setting). `"restart"`: NixOS stops every changed instance and starts it again, all at once,
        so behind the router nothing serves until the first is ready again. `"rolling"`: the switch
        leaves them running (`restartIfChanged = false`) and starts `dflash-rollout.service`, which
        runs `dflashctl rollout`: a batch at a time ({option}`services.dflash.rollout.batch`), each
        instance is taken out of the router, drained, restarted, proven ready by a real decode and
        a canary of greedy outputs, and put back before the next goes; a failed step stops it with
        the rest still on the old version and serving (`systemctl status dflash-rollout`, its
        journal). The switch returns while it runs. Without the router each instance's port is
        down while it restarts. docs/service.md, "Upgrades", says it step by step.
      '';
    };
    rollout = {
      batch = mkOption {
        type = types.ints.positive;
        default = defaults.batch;
        description = "Instances restarted together by a rolling upgrade (never more out of rotation).";
      };
      healthyForSec = mkOption {
        type = types.ints.unsigned;
        default = defaults.healthyForSec;
        description = "Seconds a restarted instance must stay in rotation before the next batch goes.";
      };
      requireIdentical = mkOption {
        type = types.bool;
        default = defaults.requireIdentical;
        description = ''
          Stop the rollout when an instance's greedy canary outputs differ from what it answered
          before its restart. Identical is expected when the model, its revision and the kernels did
          not change; leave it off for an upgrade that changes them (a difference is then a warning).
        '';
      };
    };
  };

  # A switch restarts every unit whose file changed, all at once and stopping each first: behind
  # the router nothing would serve until the first instance is ready again. A rolling upgrade
  # takes the instances from the switch, in three parts that only work together:
  # 1. every instance's unit says restartIfChanged = false (X-RestartIfChanged=false): the switch
  #    leaves a changed instance running on its old definition;
  # 2. dflash-rollout.service is wanted by multi-user.target and inactive between rollouts, so the
  #    switch starts it: `dflashctl rollout --resume` restarts, a batch at a time behind the
  #    router, each instance whose running DFLASH_UNIT_DIGEST differs from its unit's, then exits.
  #    That digest covers the whole unit as NixOS writes it (../lib/service-unit.nix), so a change
  #    to a unit that step 1 leaves running is always one step 2 restarts;
  # 3. its restartTriggers are the instances' units: a switch that changes one while a rollout
  #    runs restarts the rollout onto the new definitions (on SIGTERM it finishes its batch).
  config = lib.mkIf (instances != { } && cfg.upgrade == "rolling") {
    systemd.services =
      lib.mapAttrs' (name: _: lib.nameValuePair (unitName name) { restartIfChanged = false; }) instances
      // {
        dflash-rollout = serviceEntry.withDefaults lib.mkDefault rolloutEntry;
      };
  };
}
