# dflash-rollout.service, builtins only: services.dflash.upgrade = "rolling" (nix/modules/rollout.nix).
# Its directives come from python/dflashctl/operations/data/rollout-unit.json; this adds the command
# line (`dflashctl rollout` over the module's settings of every instance), the ordering after the
# router and the instances, the instances' units as restart triggers (a switch that changes any
# instance restarts a rollout in progress, which finishes the batch it is in first) and the stop
# timeout that lets it. Tier 1 (tests/operations/test_rollout_unit.py) evaluates it with plain Nix.
let
  unitText = import ./unit-text.nix;
  serviceEntry = import ./service-entry.nix;
  serviceData = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/service/data/service-unit.json
  );
  data = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/operations/data/rollout-unit.json
  );
  optional = cond: x: if cond then [ x ] else [ ];
  maxOf = builtins.foldl' (a: b: if b > a then b else a) 0;
in
rec {
  inherit data;

  # { Unit, Service, Install } of dflash-rollout.service. `instances`: the enabled instances
  # (name -> options); `rollout`: services.dflash.rollout; `routerSettingsFile`: null without a
  # router.
  directives =
    {
      dflashctl,
      instancesFile,
      routerSettingsFile,
      instances,
      rollout,
    }:
    let
      names = builtins.attrNames instances;
      longestStart = maxOf (
        map (n: instances.${n}.startTimeoutSec + serviceData.timeoutStartMarginSec) names
      );
    in
    {
      Unit = data.unit // {
        After =
          optional (routerSettingsFile != null) "dflash-router.service"
          ++ map (n: "dflash-${n}.service") names;
      };
      Service = data.service // {
        ExecStart = unitText.commandLine (
          [
            dflashctl
            "rollout"
            "--instance"
            instancesFile
          ]
          ++ (
            if routerSettingsFile != null then
              [
                "--router"
                routerSettingsFile
              ]
            else
              [ "--no-router" ]
          )
          ++ [
            "--resume"
            "--batch"
            (toString rollout.batch)
            "--healthy-for"
            (toString rollout.healthyForSec)
          ]
          ++ optional rollout.requireIdentical "--require-identical"
        );
        # On SIGTERM (a switch restarting it, a shutdown) it finishes the batch in progress: the
        # slowest start, the canary and the healthy hold.
        TimeoutStopSec = "${toString (longestStart + rollout.healthyForSec + data.stopMarginSec)}s";
      };
      Install = data.install;
    };

  # The whole systemd.services entry of dflash-rollout.service: the directives and, as its
  # restartTriggers, every instance's entry (`instanceEntries`: name -> service-unit.nix's entry,
  # whose DFLASH_UNIT_DIGEST covers its whole unit). Other arguments as `directives`.
  entry =
    args:
    serviceEntry.fromSections (directives (removeAttrs args [ "instanceEntries" ]))
    // {
      restartTriggers = map (n: builtins.toJSON args.instanceEntries.${n}) (
        builtins.attrNames args.instances
      );
    };
}
