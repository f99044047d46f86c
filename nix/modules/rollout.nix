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
  # the canary's defaults, bounds and what may be expected to change: dflashctl's own file
  canary = rolloutUnit.canaryData;
  canaryCount =
    key: what:
    let
      inherit (builtins) elemAt;
      bounds = canary.bounds.${key};
    in
    mkOption {
      type = types.ints.between (elemAt bounds 0) (elemAt bounds 1);
      default = canary.defaults.${key};
      description = "${what} (`dflashctl rollout --canary-${key}`).";
    };
  canaryRatio =
    key: flag: what:
    mkOption {
      type = types.addCheck types.float (r: r > 0 && r < 1) // {
        description = "number above 0 and below 1";
      };
      default = canary.defaults.${key};
      description = ''
        The step fails, before the instance is put back, when its ${what} after the restart is below
        this times what it was before (`dflashctl rollout ${flag}`). An identical build measures about
        1.0; ${canary.why.${key}}.
      '';
    };

  rolloutEntry = rolloutUnit.entry {
    inherit dflashctl instances;
    instancesFile = "${allSettings}";
    routerSettingsFile = if cfg.router.enable then routerSettingsPath else null;
    drainSec = if cfg.router.enable then cfg.router.drainSec else 0;
    instanceEntries = lib.mapAttrs instanceEntry instances;
    inherit (cfg) rollout;
  };
in
{
  imports = [
    (lib.mkRemovedOptionModule
      [
        "services"
        "dflash"
        "rollout"
        "requireIdentical"
      ]
      ''
        The canary now holds greedy outputs by default (and acceptance length and decode speed); a
        rollout meant to change them names what: services.dflash.rollout.canary.expect = [ "outputs" ]
        (or "stack", "model").
      ''
    )
  ];

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
        by the canary ({option}`services.dflash.rollout.canary`), and put back before the next goes;
        a failed step stops it with the rest still on the old version and serving (`systemctl
        status dflash-rollout`, its journal). With {option}`services.dflash.rollout.waitForVerdict`
        (the default) the switch waits for the rollout and fails when it stopped. Without the
        router each instance's port is down while it restarts. docs/service.md, "Upgrades", says it
        step by step.
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
      waitForVerdict = mkOption {
        type = types.bool;
        default = defaults.waitForVerdict;
        example = false;
        description = ''
          Whether `nixos-rebuild switch` (and so deploy-rs' activation and colmena's apply) waits for
          the rollout's verdict. `true`: dflash-rollout.service is Type=oneshot, its start job ends
          when the rollout does, and the switch exits non-zero when the rollout stopped (a failed
          canary, an instance that did not become ready), so a deployment tool stops before the next
          host and deploy-rs' magic rollback sees it. Its TimeoutStartSec adds up every instance's
          worst case (drain, canary, start, healthy hold). `false`: Type=notify, the switch returns
          once the rollout's plan is made and the verdict is only in `systemctl status
          dflash-rollout` and its journal.
        '';
      };
      canary = {
        enable = mkOption {
          type = types.bool;
          default = true;
          example = false;
          description = ''
            Whether each instance is measured alone before and after its restart (greedy outputs,
            acceptance length, decode speed, failed requests) and the step failed when the build
            is worse. `false` passes `--no-canary`: nothing is judged.
          '';
        };
        prompts = canaryCount "prompts" "Prompts (token ids) per canary reading";
        tokens = canaryCount "tokens" "Greedy tokens decoded per canary prompt";
        repeats = canaryCount "repeats" "Times each canary prompt is asked; the median counts";
        minAcceptRatio = canaryRatio "minAcceptRatio" "--canary-min-accept-ratio" "acceptance length";
        minSpeedRatio = canaryRatio "minSpeedRatio" "--canary-min-speed-ratio" "decode speed (tokens/s)";
        expect = mkOption {
          type = types.listOf (types.enum (builtins.attrNames canary.expect));
          default = [ ];
          example = [ "stack" ];
          description = ''
            What this configuration's rollout is meant to change, lifting the canary's judgments it
            would fail (`--canary-expect`): ${
              builtins.concatStringsSep "; " (
                map (k: "`${k}`: ${canary.expect.${k}.means}") (builtins.attrNames canary.expect)
              )
            }. Set it for the switch that changes them, and remove it after.
          '';
        };
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
