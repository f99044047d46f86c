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
  routerUnit = import ./lib/router-unit.nix;
  rolloutUnit = import ./lib/rollout-unit.nix;
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

  speculativeOptions = {
    algorithm = mkOption {
      type = types.nullOr (
        types.enum [
          "DFLASH"
          "DDTREE"
          "EAGLE3"
        ]
      );
      default = null;
      example = "DFLASH";
      description = ''
        Speculative decoding algorithm, passed as `--speculative-algorithm`. `null` decodes with the
        target model alone. DFLASH, DDTREE and EAGLE3 need {option}`draftModel`. DDTREE (tree
        verification of the drafter's top-k continuations) exists only in a patched SGLang: the
        build fails if the instance's {option}`package` does not offer it.
      '';
    };
    numDraftTokens = mkOption {
      type = types.nullOr types.ints.positive;
      default = null;
      example = 16;
      description = ''
        Tokens drafted per step (`--speculative-num-draft-tokens`; for DFLASH the block size).
        `null` keeps SGLang's default, which for DFLASH is the drafter's `block_size`.
      '';
    };
    ddtreeBudget = mkOption {
      type = types.nullOr types.ints.positive;
      default = null;
      example = 64;
      description = "Tree nodes verified per step with DDTREE (`--speculative-ddtree-budget`).";
    };
    draftAttentionBackend = mkOption {
      type = types.nullOr unitStr;
      default = null;
      example = "flashinfer";
      description = "Attention kernel of the drafter (`--speculative-draft-attention-backend`).";
    };
  };

  instanceOptions =
    { name, config, ... }:
    {
      options = {
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
        model = mkOption {
          type = unitStr;
          example = "Qwen/Qwen3-8B";
          description = ''
            Target model: a Hugging Face repo id (downloaded into {option}`cacheDir`) or a local
            directory (`--model-path`).
          '';
        };
        draftModel = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "z-lab/Qwen3-8B-DFlash-b16";
          description = "Drafter for speculative decoding (`--speculative-draft-model-path`).";
        };
        # Models pinned like the code: a commit per hub model, fetched ahead, no hub at start.
        modelRevision = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "0e9e39f249a16976918f6564b8830bc894c89659";
          description = ''
            Hub revision of {option}`model` (`--revision`). A commit hash gives every host the same
            weights; a branch name (or `null`, the hub's `main`) follows the hub, and
            `dflashctl validate` warns about it. Not allowed for a local directory.
          '';
        };
        draftModelRevision = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "3b1c0d2e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c";
          description = "Hub revision of {option}`draftModel` (`--speculative-draft-model-revision`), as for {option}`modelRevision`.";
        };
        hfTokenFile = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "/run/secrets/hf-token";
          description = ''
            File holding a hub token, for gated models. A path as a string, never copied into the
            Nix store: systemd hands it to the service with `LoadCredential`, and dflashctl gives it
            to SGLang only as `HF_TOKEN` in its environment (never in argv, logs or settings).
          '';
        };
        offline = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Start without reaching the hub (`HF_HUB_OFFLINE=1`): the pinned revisions must already
            be in the cache (`dflashctl models fetch --config <settings>`). Preflight refuses to
            start within seconds, naming the missing files, when they are not.
          '';
        };
        speculative = mkOption {
          type = types.submodule { options = speculativeOptions; };
          default = { };
          example = {
            algorithm = "DFLASH";
            numDraftTokens = 16;
          };
          description = "Speculative decoding settings.";
        };
        gpus = mkOption {
          type = types.listOf types.ints.unsigned;
          default = [ ];
          example = [
            0
            1
          ];
          description = ''
            GPU indices this instance uses; they become `CUDA_VISIBLE_DEVICES`. The empty list
            leaves every GPU visible (and then conflicts with every other instance).
          '';
        };
        allowSharedGpus = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Allow a GPU of this instance to appear in another instance's {option}`gpus` (both must
            set it). Lower {option}`memFractionStatic` so both fit.
          '';
        };
        tpSize = mkOption {
          type = types.ints.positive;
          default = 1;
          example = 2;
          description = "Tensor-parallel size (`--tp-size`); at most the number of {option}`gpus`.";
        };
        host = mkOption {
          type = unitStr;
          default = "127.0.0.1";
          example = "0.0.0.0";
          description = "Address the OpenAI-compatible HTTP API listens on (`--host`).";
        };
        port = mkOption {
          type = types.port;
          default = 30000;
          example = 30001;
          description = "TCP port of the HTTP API (`--port`); one per instance.";
        };
        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = "Open {option}`port` in `networking.firewall.allowedTCPPorts`.";
        };
        grammarBackend = mkOption {
          type = types.enum [
            "xgrammar"
            "llguidance"
            "outlines"
            "none"
          ];
          default = "xgrammar";
          description = ''
            Constrained decoding backend (`--grammar-backend`); preflight checks it imports with the
            names SGLang needs. `none` makes SGLang refuse every JSON-schema, regex, EBNF,
            structural-tag and tool-call request (the build prints a warning); `dflashctl smoke`
            checks all five against xgrammar.
          '';
        };
        constrainedJsonDisableAnyWhitespace = mkOption {
          type = types.bool;
          default = false;
          example = true;
          description = ''
            JSON constrained by a JSON schema or a `tool_choice` gets fixed separators (`, ` and
            `: `) instead of any amount of whitespace between its tokens
            (`--constrained-json-disable-any-whitespace`). A model that does not close its JSON may
            otherwise pad it with whitespace until `max_tokens`: on an H200, a random-weight model
            gave 0 of 5 valid JSON answers without it and 5 of 5 with it. The JSON inside a
            structural tag is not affected.
          '';
        };
        attentionBackend = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "fa3";
          description = "Attention kernel of the target (`--attention-backend`); `null`: SGLang picks.";
        };
        memFractionStatic = mkOption {
          type = types.nullOr (types.numbers.between 0 1);
          default = null;
          example = 0.85;
          description = "Share of GPU memory for weights and KV cache (`--mem-fraction-static`).";
        };
        contextLength = mkOption {
          type = types.nullOr types.ints.positive;
          default = null;
          example = 32768;
          description = "Maximum context length (`--context-length`); `null`: the model's own.";
        };
        servedModelName = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "qwen3-8b";
          description = "Model name the API reports and accepts (`--served-model-name`).";
        };
        apiKeyFile = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "/run/secrets/dflash-api-key";
          description = ''
            File holding the API key clients must send as `Authorization: Bearer`. A path as a
            string, never copied into the Nix store: systemd hands it to the service with
            `LoadCredential`, and dflashctl passes it to SGLang as `--api-key`.
          '';
        };
        enableMetrics = mkOption {
          type = types.bool;
          default = false;
          description = "Serve Prometheus metrics at `/metrics` (`--enable-metrics`).";
        };
        environment = mkOption {
          type = types.attrsOf unitStr;
          default = { };
          example = {
            NCCL_DEBUG = "WARN";
          };
          description = "Extra environment variables for SGLang (not for the preflight probes).";
        };
        extraArgs = mkOption {
          type = types.listOf unitStr;
          default = [ ];
          example = [
            "--max-running-requests"
            "64"
          ];
          description = ''
            Further SGLang flags, appended last. Flags that an option above sets are refused at
            build time: set the option instead.
          '';
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
        cacheDir = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "/var/cache/hf";
          description = ''
            Model download cache (`HF_HOME`). `null`: `/var/cache/dflash-${name}` (systemd's
            `CacheDirectory`). Under `/var/cache` or `/var/lib` systemd creates and owns it
            (`CacheDirectory`/`StateDirectory`), also under `DynamicUser`; two `DynamicUser`
            instances cannot share one. Elsewhere (e.g. `/srv/hf`) it needs a static
            {option}`user`: systemd-tmpfiles creates it for that user, `ReadWritePaths` opens it.
            Refused under `/home`, `/root`, `/run/user` (ProtectHome) and `/tmp`, `/var/tmp`
            (PrivateTmp), which the sandbox hides.
          '';
        };
        driverLibraryDir = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "/usr/lib/x86_64-linux-gnu";
          description = ''
            Directory holding the host's NVIDIA driver libraries (`libcuda.so.1`). `null` lets
            `dflashctl serve` find it: `/run/opengl-driver/lib` on NixOS, else the host's
            `/etc/ld.so.cache` and the usual directories. Only the driver's libraries are put on
            SGLang's `LD_LIBRARY_PATH`, through a directory of links in the cache.
          '';
        };
        startTimeoutSec = mkOption {
          type = types.ints.positive;
          default = 900;
          example = 1800;
          description = ''
            Seconds SGLang may take to load and decode its first token. A process that exits is
            reported at once, whatever this says; `TimeoutStartSec` adds time for the preflight.
          '';
        };
        stallTimeoutSec = mkOption {
          type = types.ints.unsigned;
          default = 300;
          example = 600;
          description = ''
            Seconds SGLang may go without start-up progress (no new log output and no change in its
            GPUs' memory) before it is stopped as stalled, with the last thing it logged (exit 93,
            restarted with backoff). `0` turns the check off; `startTimeoutSec` still applies.
          '';
        };
        loadFormat = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "dummy";
          description = "Weight format (`--load-format`); `dummy` gives random weights (smoke tests).";
        };
        draftLoadFormat = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "dummy";
          description = "Weight format of the drafter (`--speculative-draft-load-format`).";
        };
        skipTokenizerInit = mkOption {
          type = types.bool;
          default = false;
          description = "Take token ids instead of text (`--skip-tokenizer-init`; smoke tests).";
        };
        cudaGraphMaxBs = mkOption {
          type = types.nullOr types.ints.positive;
          default = null;
          example = 8;
          description = "Largest batch captured in CUDA graphs (`--cuda-graph-max-bs`).";
        };
        samplingBackend = mkOption {
          type = types.nullOr unitStr;
          default = null;
          example = "pytorch";
          description = "Sampling kernel (`--sampling-backend`).";
        };
        disableCudaGraph = mkOption {
          type = types.bool;
          default = false;
          description = "Run without CUDA graphs (`--disable-cuda-graph`): faster start, slower decode.";
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
