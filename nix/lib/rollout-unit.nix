# dflash-rollout.service, builtins only: services.dflash.upgrade = "rolling" (nix/modules/rollout.nix).
# Its directives come from python/dflashctl/operations/data/rollout-unit.json; this adds the command
# line (`dflashctl rollout` over the module's settings of every instance, with the canary's
# options), the ordering after the router and the instances, the instances' units as restart
# triggers (a switch that changes any instance restarts a rollout in progress, which finishes the
# batch it is in first), the stop timeout that lets it, and whether the switch waits for the
# rollout's verdict (Type=oneshot and a start timeout over every instance's worst case) or returns
# once its plan is made (Type=notify). Tier 1 (tests/operations/test_rollout_unit.py) evaluates it
# with plain Nix.
let
  unitText = import ./unit-text.nix;
  serviceEntry = import ./service-entry.nix;
  serviceData = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/service/data/service-unit.json
  );
  data = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/operations/data/rollout-unit.json
  );
  # the canary's defaults, bounds and request limit: the same file `dflashctl rollout` reads
  canaryData = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/operations/data/canary.json
  );
  optional = cond: x: if cond then [ x ] else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };
  maxOf = builtins.foldl' (a: b: if b > a then b else a) 0;
  sumOf = builtins.foldl' (a: b: a + b) 0;

  # `dflashctl rollout`'s canary flags for services.dflash.rollout.canary (operations/canary.py's
  # add_arguments); --no-canary alone when it is off, as the rollout refuses both together.
  canaryArgs =
    c:
    if !c.enable then
      [ "--no-canary" ]
    else
      [
        "--canary-prompts"
        (toString c.prompts)
        "--canary-tokens"
        (toString c.tokens)
        "--canary-repeats"
        (toString c.repeats)
        "--canary-min-accept-ratio"
        (builtins.toJSON c.minAcceptRatio)
        "--canary-min-speed-ratio"
        (builtins.toJSON c.minSpeedRatio)
      ]
      ++ builtins.concatMap (e: [
        "--canary-expect"
        e
      ]) c.expect;

  # Seconds one canary reading may take at most: every prompt asked repeats + 1 times (a warm-up),
  # each request within canary.json's requestLimit.
  canaryReadingSec =
    c:
    let
      limit = canaryData.requestLimit;
    in
    if c.enable then
      c.prompts * (c.repeats + 1) * (limit.baseSec + limit.perTokenSec * c.tokens)
    else
      0;
in
rec {
  inherit data canaryData;

  # The whole rollout's bound when the switch waits for it: every instance's worst case (see
  # rollout-unit.json's why.perInstanceMarginSec), whatever the batch.
  startTimeoutSec =
    {
      instances,
      rollout,
      drainSec ? 0,
    }:
    builtins.ceil (
      sumOf (
        map (
          n:
          drainSec
          + 2 * canaryReadingSec rollout.canary
          + instances.${n}.startTimeoutSec
          + serviceData.timeoutStartMarginSec
          + rollout.healthyForSec
          + data.perInstanceMarginSec
        ) (builtins.attrNames instances)
      )
      + data.stopMarginSec
    );

  # { Unit, Service, Install } of dflash-rollout.service. `instances`: the enabled instances
  # (name -> options); `rollout`: services.dflash.rollout; `routerSettingsFile`: null without a
  # router; `drainSec`: the router's.
  directives =
    {
      dflashctl,
      instancesFile,
      routerSettingsFile,
      instances,
      rollout,
      drainSec ? 0,
    }:
    let
      names = builtins.attrNames instances;
      longestStart = maxOf (
        map (n: instances.${n}.startTimeoutSec + serviceData.timeoutStartMarginSec) names
      );
      # an instance's step besides its start: its drain, the canary before and after, the hold
      aroundStart = drainSec + 2 * canaryReadingSec rollout.canary + rollout.healthyForSec;
      stopSec = builtins.ceil (aroundStart + longestStart + data.stopMarginSec);
      startSec = startTimeoutSec { inherit instances rollout drainSec; };
    in
    {
      Unit = data.unit // {
        After =
          optional (routerSettingsFile != null) "dflash-router.service"
          ++ map (n: "dflash-${n}.service") names;
      };
      Service = data.service // {
        Type = if rollout.waitForVerdict then data.type.waits else data.type.returns;
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
          ++ canaryArgs rollout.canary
        );
        # On SIGTERM (a switch restarting it, a shutdown) it finishes the batch in progress: its
        # drain, the canary before and after, the slowest start and the healthy hold.
        TimeoutStopSec = "${toString stopSec}s";
      }
      // optionalAttrs rollout.waitForVerdict { TimeoutStartSec = "${toString startSec}s"; };
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
