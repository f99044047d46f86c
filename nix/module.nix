# services.dflash: SGLang + DFlash instances, one systemd unit each (dflash-<name>.service).
#
# Option declarations and their wiring into NixOS only. What decides a unit (its directives from
# the data file `dflashctl unit` renders from, escaping, credentials, cache directories), the
# refusals and warnings that need no package, and the settings file are pure functions in
# ./lib/service-unit.nix, which tier 1 evaluates without nixpkgs. Everything that knows SGLang
# (flag mapping, rules, preflight) is in dflashctl: `dflashctl validate` runs at build time over
# all instances with dflashctl alone, and against the package's SGLang for DDTREE instances.
# Directives are set at mkDefault priority, so a host can override any of them.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib)
    mkDefault
    mkOption
    types
    literalExpression
    ;

  cfg = config.services.dflash;
  serviceUnit = import ./lib/service-unit.nix;
  settings = import ./lib/settings.nix;
  routerUnit = import ./lib/router-unit.nix;
  rolloutUnit = import ./lib/rollout-unit.nix;
  monitoring = import ./lib/monitoring.nix;
  routerDefaults = routerUnit.data.defaults;
  unitText = import ./lib/unit-text.nix;
  instances = lib.filterAttrs (_: i: i.enable) cfg.instances;
  dflashctl = lib.getExe' cfg.dflashctlPackage "dflashctl";
  pythonOf = i: "${i.package}/bin/python";

  # Every string option that reaches the unit or the settings: no newline or other control
  # character (`dflashctl validate` refuses the same; the message names the option).
  unitStr = types.addCheck types.str (s: unitText.controlProblem s == null) // {
    name = "unitStr";
    description = "string without newlines or other control characters";
  };
  # The names NixOS accepts for users and groups.
  accountName = types.strMatching "[a-zA-Z0-9_.][a-zA-Z0-9_.-]*";

  settingsOf =
    name: i: serviceUnit.settings name (serviceUnit.withPrebuiltKernels cfg.kernelsPackage i);
  settingsFile = name: i: pkgs.writeText "dflash-${name}.json" (builtins.toJSON (settingsOf name i));
  allSettings = pkgs.writeText "dflash-instances.json" (
    builtins.toJSON { instances = lib.mapAttrs settingsOf instances; }
  );

  # Build-time validation, rules written once in Python. Step 1: every instance's settings and the
  # rules across instances, with dflashctl alone (seconds; no stack is built for it).
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

  instanceOptions =
    { name, config, ... }:
    {
      # The settings dflashctl reads, declared from its schema (nix/lib/settings.nix); the
      # options below them are the module's own.
      options = settings.options { inherit lib unitStr; } name // {
        enable = mkOption {
          type = types.bool;
          default = true;
          description = "Whether to run this instance as `dflash-${name}.service`.";
        };
        package = mkOption {
          type = types.package;
          default = cfg.package;
          defaultText = literalExpression "config.services.dflash.package";
          description = ''
            The Python environment with the pinned stack (SGLang, torch, sgl_kernel, xgrammar).
            Its `bin/python` runs SGLang and the preflight probes. Use an environment built with a
            patched SGLang for DDTREE.
          '';
        };
        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = "Open {option}`port` in `networking.firewall.allowedTCPPorts`.";
        };
        user = mkOption {
          type = types.nullOr accountName;
          default = null;
          example = "dflash";
          description = ''
            Static user to run as (`User=`, `DynamicUser=false`). A user the host already declares
            (normal or system) is used as it is; otherwise it is created as a system user with the
            group of the same name. `null` runs under `DynamicUser` and renders no `User=`.
          '';
        };
        group = mkOption {
          type = types.nullOr accountName;
          default = null;
          description = ''
            Group to run as (`Group=`, created if needed); `null`: the primary group of
            {option}`user`. Only used when {option}`user` is set.
          '';
        };
      };
    };

  # The primary group a static user runs with (NixOS picks it when the instance names none).
  groupOf = i: if i.group != null then i.group else config.users.users.${i.user}.group;

  # A systemd.services entry from a pure function's { Unit, Service, Install }. Dependency lists
  # merge with a host's own (NixOS list options); everything else is mkDefault, so a host wins.
  serviceOf = d: {
    description = mkDefault d.Unit.Description;
    after = d.Unit.After or [ ];
    wants = d.Unit.Wants or [ ];
    before = d.Unit.Before or [ ];
    wantedBy = d.Install.WantedBy;
    unitConfig = lib.mapAttrs (_: mkDefault) (
      removeAttrs d.Unit [
        "Description"
        "After"
        "Wants"
        "Before"
      ]
    );
    serviceConfig = lib.mapAttrs (_: mkDefault) d.Service;
  };

  directivesOf =
    name: i:
    serviceUnit.directives {
      inherit name dflashctl;
      instance = i;
      python = pythonOf i;
      settingsFile = "${settingsFile name i}";
    };

  unitOf =
    name: i:
    serviceOf (directivesOf name i)
    // {
      # SGLang's first start compiles JIT kernels: nvcc comes from the stack's own wheels (serve
      # points CUDA_HOME at them), the host compiler it and tvm-ffi call (gcc, c++) from here.
      path = [ cfg.hostCompilerPackage ];
      # upgrade = "rolling": a switch leaves a changed instance running; dflash-rollout.service
      # restarts it, a batch at a time behind the router.
      restartIfChanged = cfg.upgrade != "rolling";
    };

  # The rolling upgrade's unit: `dflashctl rollout` over every instance's settings.
  rolloutService =
    let
      d = rolloutUnit.directives {
        inherit dflashctl instances;
        instancesFile = "${allSettings}";
        routerSettingsFile = if rcfg.enable then "/etc/${routerEtc}" else null;
        instanceDirectives = lib.mapAttrs directivesOf instances;
        rollout = cfg.rollout;
      };
    in
    serviceOf d // { inherit (d) restartTriggers; };
  rolloutDefaults = rolloutUnit.data.defaults;

  # The router: its settings in /etc (a stable path, so a change of workers alone reloads it),
  # checked at build time by `dflashctl router --dry-run`, which refuses what it would refuse.
  rcfg = cfg.router;
  routerSettings = routerUnit.settings rcfg instances;
  routerSettingsFile = pkgs.writeText "dflash-router.json" (builtins.toJSON routerSettings);
  routerPython = "${rcfg.package}/bin/python";
  routerCheck = pkgs.runCommand "dflash-validate-router" { } ''
    ${dflashctl} router --config ${routerSettingsFile} --python ${routerPython} --dry-run >/dev/null
    touch $out
  '';
  routerService =
    let
      d = routerUnit.directives {
        settings = routerSettings;
        inherit dflashctl;
        python = routerPython;
        settingsFile = "/etc/${routerEtc}";
      };
    in
    serviceOf d
    // {
      # Workers added or removed (instances, their ports, remoteWorkers): `systemctl reload`
      # (dflashctl router --sync, no dropped requests); any other setting: a restart.
      reloadTriggers = (routerUnit.triggers routerSettings).reload;
      restartTriggers = (routerUnit.triggers routerSettings).restart;
    };
  routerEtc = lib.removePrefix "/etc/" routerUnit.data.settingsPath;

  # Prometheus and Grafana where the host runs them: every instance with enableMetrics and the
  # router scraped, the alert rules with this host's thresholds, the dashboard.
  pcfg = cfg.prometheus;
  exporters = config.services.prometheus.exporters or { };
  gpuTargets = lib.optionals pcfg.gpuExporters (
    lib.concatLists (
      map (
        e: lib.optional (exporters.${e}.enable or false) "127.0.0.1:${toString exporters.${e}.port}"
      ) monitoring.gpuExporterOptions
    )
  );
  ruleFile = pkgs.writeText "dflash.rules.json" (
    builtins.toJSON (
      monitoring.ruleFile {
        inherit instances;
        inherit (pcfg) minAcceptLength ttftP99Sec alertFor;
      }
    )
  );
  dashboards = pkgs.runCommand "dflash-grafana-dashboards" { } ''
    mkdir $out
    cp ${monitoring.dashboardFile} $out/dflash-host.json
  '';
  # What Prometheus would refuse in these options (bad durations), or what makes an alert
  # meaningless: refused here as `dflashctl monitoring` refuses it.
  monitoringProblems = monitoring.problems {
    inherit (pcfg) alertFor minAcceptLength ttftP99Sec;
    intervalSec = pcfg.scrapeIntervalSec;
  };
  monitoringConfig = {
    assertions = [
      {
        assertion = builtins.all (n: builtins.elem n monitoring.alertNames) (
          builtins.attrNames pcfg.alertFor
        );
        message = "services.dflash.prometheus.alertFor names an alert that dflash.rules.json does not have; the alerts are ${builtins.concatStringsSep ", " monitoring.alertNames}";
      }
      {
        assertion = monitoringProblems == [ ];
        message = "services.dflash.prometheus: ${builtins.concatStringsSep "; " monitoringProblems}";
      }
      {
        assertion = builtins.all (n: instances ? ${n}) (builtins.attrNames pcfg.minAcceptLength);
        message = "services.dflash.prometheus.minAcceptLength names an instance that is not enabled here (the instances: ${builtins.concatStringsSep ", " (builtins.attrNames instances)})";
      }
    ];
    services.prometheus.scrapeConfigs = monitoring.scrapeConfigs {
      inherit instances gpuTargets;
      router = if rcfg.enable then routerSettings else null;
      intervalSec = pcfg.scrapeIntervalSec;
    };
    services.prometheus.ruleFiles = [ ruleFile ];
  };

  routerOption =
    type: key: description:
    mkOption {
      inherit type description;
      default = routerDefaults.${key};
    };

  # Every enabled instance: its unit, the checks and rules, its user and cache directory.
  instancesConfig = {
    assertions =
      lib.concatLists (lib.mapAttrsToList serviceUnit.assertions instances)
      ++ serviceUnit.sharedCacheAssertions instances
      ++ lib.concatLists (
        lib.mapAttrsToList (
          name: i:
          serviceUnit.execAssertions name {
            inherit dflashctl;
            python = pythonOf i;
            settingsFile = "${settingsFile name i}";
          }
        ) instances
      );

    warnings = lib.concatLists (lib.mapAttrsToList serviceUnit.warnings instances);

    system.checks = [
      settingsCheck
    ]
    ++ lib.mapAttrsToList packageCheck ddtreeInstances
    ++ lib.mapAttrsToList modelsCheck storeModelInstances;

    systemd.services =
      lib.mapAttrs' (name: i: lib.nameValuePair "dflash-${name}" (unitOf name i)) instances
      // lib.optionalAttrs (cfg.upgrade == "rolling") { dflash-rollout = rolloutService; };

    # One place that names every instance's settings (`dflashctl status` reads it).
    environment.etc."dflash-instances.json".source = allSettings;

    # A static user's cacheDir outside /var/cache and /var/lib, created and owned for it.
    systemd.tmpfiles.rules = lib.concatLists (
      lib.mapAttrsToList (_: i: serviceUnit.tmpfiles i (groupOf i)) instances
    );

    # A static user the host declares is used as it is (normal or system); one it does not is
    # created as a system user. Below mkDefault, so the host's own definitions win.
    users.users = lib.mkMerge (
      lib.mapAttrsToList (
        _: i:
        lib.mkIf (i.user != null) {
          ${i.user} = {
            isSystemUser = mkDefault (!config.users.users.${i.user}.isNormalUser);
            group = lib.mkOverride 1250 (if i.group != null then i.group else i.user);
          };
        }
      ) instances
    );
    users.groups = lib.mkMerge (
      lib.mapAttrsToList (_: i: lib.mkIf (i.user != null) { ${groupOf i} = { }; }) instances
    );

    networking.firewall.allowedTCPPorts = lib.concatLists (
      lib.mapAttrsToList (_: i: lib.optional i.openFirewall i.port) instances
    );
  };
in
{
  options.services.dflash = {
    package = lib.mkPackageOption pkgs "dflash-env" { } // {
      description = ''
        Default Python environment of the pinned stack for every instance (this flake's
        `packages.<system>.dflash-env`, or one built with a patched SGLang).
      '';
    };
    dflashctlPackage = lib.mkPackageOption pkgs "dflashctl" { };
    hostCompilerPackage = lib.mkPackageOption pkgs "dflashHostCompiler" { } // {
      description = ''
        C/C++ compiler on the units' PATH, which nvcc and tvm-ffi call when SGLang compiles its JIT
        kernels at the first start (this flake's pinned GCC 14: CUDA 13.0 refuses GCC newer than 15).
      '';
    };
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
        default = rolloutDefaults.batch;
        description = "Instances restarted together by a rolling upgrade (never more out of rotation).";
      };
      healthyForSec = mkOption {
        type = types.ints.unsigned;
        default = rolloutDefaults.healthyForSec;
        description = "Seconds a restarted instance must stay in rotation before the next batch goes.";
      };
      requireIdentical = mkOption {
        type = types.bool;
        default = rolloutDefaults.requireIdentical;
        description = ''
          Stop the rollout when an instance's greedy canary outputs differ from what it answered
          before its restart. Identical is expected when the model, its revision and the kernels did
          not change; leave it off for an upgrade that changes them (a difference is then a warning).
        '';
      };
    };
    kernelsPackage = mkOption {
      type = types.nullOr types.package;
      default = null;
      example = literalExpression ''dflash.packages.''${system}.dflash-kernels.override { cudaArchs = [ "sm120" ]; }'';
      description = ''
        SGLang's JIT kernels built ahead without a GPU (`dflashctl kernels build`), given to every
        instance as `DFLASH_PREBUILT_KERNELS` in its settings' environment (an instance's own value
        wins): a first start loads them instead of compiling for about a minute. A kernel the
        package lacks (another GPU arch, another model shape, a patched SGLang) is compiled into
        the instance's cache directory at the first start, as without it. Triton's kernels are in it
        as recorded on a GPU (the package's `tritonRecords`; the smoke's sm90 recording is built in,
        and carried to sm100 and sm120 where its kernels' specialisation does not depend on the GPU).
        `null`: every host compiles its own at the first start.
      '';
    };
    router = {
      enable = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Run SGLang's router (sglang-router, pinned in nix/router-lock.json) as
          `dflash-router.service`: one endpoint in front of every enabled instance, which health-checks
          them, retries a request on another instance and re-admits a restarted one. Its defaults
          were chosen by measurement (docs/service.md, "Router").
        '';
      };
      package = lib.mkPackageOption pkgs "dflash-router-env" { } // {
        description = "Python environment with the pinned router (this flake's `dflash-router-env`).";
      };
      host = routerOption unitStr "host" "Address clients connect to (`--host`).";
      port = routerOption types.port "port" "Port clients connect to; not an instance's port.";
      metricsHost = routerOption unitStr "metricsHost" "Address of the Prometheus metrics.";
      metricsPort = routerOption types.port "metricsPort" "Port of the Prometheus metrics.";
      policy = routerOption (types.enum [
        "round_robin"
        "cache_aware"
        "power_of_two"
        "random"
      ]) "policy" "How requests are spread over the workers (`--policy`).";
      healthCheckIntervalSec =
        routerOption types.ints.positive "healthCheckIntervalSec"
          "Seconds between health checks of each worker.";
      healthCheckTimeoutSec =
        routerOption types.ints.positive "healthCheckTimeoutSec"
          "Seconds a worker's `/health` may take (at least 2: SGLang's takes about 1 s under load).";
      healthFailureThreshold =
        routerOption types.ints.positive "healthFailureThreshold"
          "Failed checks in a row that take a worker out.";
      healthSuccessThreshold =
        routerOption types.ints.positive "healthSuccessThreshold"
          "Passed checks in a row that bring a worker back.";
      circuitBreakerFailures =
        routerOption types.ints.positive "circuitBreakerFailures"
          "Failed requests in a row that open a worker's circuit breaker.";
      circuitBreakerOpenSec =
        routerOption types.ints.positive "circuitBreakerOpenSec"
          "Seconds an open circuit breaker keeps a worker out.";
      retries =
        routerOption types.ints.unsigned "retries"
          "Retries of a failed request on other workers.";
      requestTimeoutSec =
        routerOption types.ints.positive "requestTimeoutSec"
          "Seconds a request may take before the router gives up on it (a hung GPU).";
      workerStartupTimeoutSec =
        routerOption types.ints.positive "workerStartupTimeoutSec"
          "Seconds a worker down at the router's start is waited for (after that 0.3.2 never adds it).";
      drainSec =
        routerOption types.ints.unsigned "drainSec"
          "Seconds the router lets requests in flight finish when stopped (`TimeoutStopSec` is above it).";
      apiKeyFile = mkOption {
        type = types.nullOr unitStr;
        default = null;
        example = "/run/secrets/dflash-api-key";
        description = ''
          Clients' API key (`Authorization: Bearer`), read through `LoadCredential`. `null`: the
          instances' own apiKeyFile if they have one (they must share it: sglang-router 0.3.2 sends
          the key it checks to every worker).
        '';
      };
      adminApiKeyFile = mkOption {
        type = types.nullOr unitStr;
        default = null;
        example = "/run/secrets/dflash-router-admin";
        description = ''
          Key of the router's admin API (`/workers`: adding and removing workers), read through
          `LoadCredential`. Required when {option}`host` is not a loopback address.
        '';
      };
      logLevel = mkOption {
        type = types.enum [
          "debug"
          "info"
          "warn"
          "error"
        ];
        default = "info";
        description = "The router's log level.";
      };
      remoteWorkers = mkOption {
        type = types.listOf unitStr;
        default = [ ];
        example = [ "http://10.0.0.2:30000" ];
        description = "Instances of other hosts to route to as well, as `http://HOST:PORT`.";
      };
      extraArgs = mkOption {
        type = types.listOf unitStr;
        default = [ ];
        description = "Further sglang-router flags; flags a setting above owns are refused at build time.";
      };
      openFirewall = mkOption {
        type = types.bool;
        default = false;
        description = "Open {option}`port` in `networking.firewall.allowedTCPPorts`.";
      };
    };
    prometheus = {
      enable = mkOption {
        type = types.bool;
        default = config.services.prometheus.enable or false;
        defaultText = literalExpression "config.services.prometheus.enable";
        description = ''
          Add to this host's Prometheus (`services.prometheus`) a scrape configuration for every
          instance with {option}`enableMetrics` (its own port, where SGLang serves `/metrics`;
          label `dflash_instance`), for the router's metrics port, and for the host's
          dcgm-exporter or nvidia_gpu_exporter ({option}`gpuExporters`), and the alert rules
          (`dflash.rules.json`, with this host's thresholds). `dflashctl monitoring` writes the same
          files for other hosts; docs/monitoring.md lists the alerts and what each asks you to do.
        '';
      };
      scrapeIntervalSec = mkOption {
        type = types.ints.positive;
        default = monitoring.data.scrapeIntervalSec;
        description = "Scrape interval of the instances, the router and the GPU exporters, in seconds.";
      };
      minAcceptLength = mkOption {
        type = types.attrsOf types.numbers.positive;
        default = { };
        example = {
          qwen3 = 5.0;
        };
        description = ''
          Per speculative instance, the acceptance length below which DflashAcceptanceLow fires (after
          10 minutes while it decodes); at least 1 (SGLang's acceptance length counts the bonus token).
          Default: a quarter of its block ({option}`speculative.numDraftTokens`, else 16 for DFLASH and
          DDTREE, 4 for EAGLE3), at least 1.5.
        '';
      };
      ttftP99Sec = mkOption {
        type = types.numbers.positive;
        default = monitoring.data.thresholds.ttftP99Sec.default;
        description = "Time to first token p99 (over 5 minutes) above which DflashTimeToFirstTokenHigh fires.";
      };
      alertFor = mkOption {
        type = types.attrsOf unitStr;
        default = { };
        example = {
          DflashAcceptanceLow = "30m";
        };
        description = "Another `for:` (how long a condition must hold) for an alert, by name: a Prometheus duration (units y, w, d, h, m, s, ms, largest first: 30m, 1h30m); one Prometheus does not read fails an assertion, as `dflashctl monitoring --alert-for` refuses it.";
      };
      gpuExporters = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Also scrape `services.prometheus.exporters.dcgm` and `.nvidia-gpu` where the host enables
          them (job `dflash-gpus`): the GPU rules read their XID, ECC, row-remapping, throttling and
          memory metrics. Turn it off when the host scrapes them in a job of its own.
        '';
      };
    };
    grafana.enable = mkOption {
      type = types.bool;
      default = config.services.grafana.enable or false;
      defaultText = literalExpression "config.services.grafana.enable";
      description = ''
        Provision the "DFlash host" dashboard in this host's Grafana (`services.grafana`): per instance
        tokens/s, time to first token and inter-token latency, acceptance length, running and queued
        requests, KV-cache usage; the router's requests, retries, responses and workers. It asks for a
        Prometheus data source that scrapes what {option}`services.dflash.prometheus` configures.
      '';
    };
    instances = mkOption {
      type = types.attrsOf (types.submodule instanceOptions);
      default = { };
      example = literalExpression ''
        {
          qwen = {
            model = "Qwen/Qwen3-8B";
            draftModel = "z-lab/Qwen3-8B-DFlash-b16";
            speculative.algorithm = "DFLASH";
            gpus = [ 0 ];
            port = 30000;
          };
        }
      '';
      description = ''
        SGLang instances, typically one per GPU or GPU set; each runs as `dflash-<name>.service`,
        ready (`Type=notify`) only once it has decoded a token.
      '';
    };
  };

  config = lib.mkMerge [
    (lib.mkIf (instances != { }) instancesConfig)
    (lib.mkIf (pcfg.enable && (instances != { } || rcfg.enable)) monitoringConfig)
    (lib.mkIf cfg.grafana.enable {
      services.grafana.provision.enable = mkDefault true;
      services.grafana.provision.dashboards.settings.providers = [
        {
          name = "dflash";
          options.path = dashboards;
        }
      ];
    })
    (lib.mkIf rcfg.enable {
      assertions =
        routerUnit.assertions rcfg instances
        ++ routerUnit.execAssertions {
          inherit dflashctl;
          python = routerPython;
          settingsFile = "/etc/${routerEtc}";
        };
      system.checks = [ routerCheck ];
      environment.etc.${routerEtc}.source = routerSettingsFile;
      systemd.services.dflash-router = routerService;
      networking.firewall.allowedTCPPorts = lib.optional rcfg.openFirewall rcfg.port;
    })
  ];
}
