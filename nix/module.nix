# services.dflash: SGLang + DFlash instances, one systemd unit each (dflash-<name>.service).
#
# The module only declares options and writes each instance's settings as JSON. Everything that
# knows SGLang (flag mapping, rules, preflight) is in dflashctl: `dflashctl validate` runs at build
# time over all instances (system.checks), `dflashctl serve --config <json>` runs the instance.
# The unit's directives and hardening come from the same file `dflashctl unit` renders from.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;

  cfg = config.services.dflash;
  unitData = lib.importJSON ../python/dflashctl/service/data/service-unit.json;
  instances = lib.filterAttrs (_: i: i.enable) cfg.instances;
  dflashctl = lib.getExe' cfg.dflashctlPackage "dflashctl";
  pythonOf = i: "${i.package}/bin/python";

  # The settings dflashctl reads: the option names as they are, module-only options left out.
  settingsOf =
    name: i:
    {
      inherit name;
      speculative = {
        inherit (i.speculative)
          algorithm
          numDraftTokens
          ddtreeBudget
          draftAttentionBackend
          ;
      };
    }
    // lib.getAttrs [
      "model"
      "draftModel"
      "gpus"
      "allowSharedGpus"
      "tpSize"
      "host"
      "port"
      "grammarBackend"
      "constrainedJsonDisableAnyWhitespace"
      "attentionBackend"
      "memFractionStatic"
      "contextLength"
      "servedModelName"
      "apiKeyFile"
      "enableMetrics"
      "environment"
      "extraArgs"
      "cacheDir"
      "startTimeoutSec"
      "loadFormat"
      "draftLoadFormat"
      "skipTokenizerInit"
      "cudaGraphMaxBs"
      "samplingBackend"
      "disableCudaGraph"
    ] i;
  settingsFile = name: i: pkgs.writeText "dflash-${name}.json" (builtins.toJSON (settingsOf name i));
  allSettings = pkgs.writeText "dflash-instances.json" (
    builtins.toJSON { instances = lib.mapAttrs settingsOf instances; }
  );

  # Build-time validation: the rules are written once, in Python. Cross-instance rules over all
  # instances; each speculative instance also against the SGLang of its own package (DDTREE).
  validation = pkgs.runCommand "dflash-validate" { } ''
    ${dflashctl} validate ${allSettings}
    ${lib.concatStringsSep "\n" (
      lib.mapAttrsToList (
        name: i:
        lib.optionalString (
          i.speculative.algorithm != null
        ) "${dflashctl} validate ${settingsFile name i} --python ${pythonOf i}"
      ) instances
    )}
    touch $out
  '';

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
      type = types.nullOr types.str;
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
          type = types.str;
          example = "Qwen/Qwen3-8B";
          description = ''
            Target model: a Hugging Face repo id (downloaded into {option}`cacheDir`) or a local
            directory (`--model-path`).
          '';
        };
        draftModel = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "z-lab/Qwen3-8B-DFlash-b16";
          description = "Drafter for speculative decoding (`--speculative-draft-model-path`).";
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
          type = types.str;
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
          type = types.nullOr types.str;
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
          type = types.nullOr types.str;
          default = null;
          example = "qwen3-8b";
          description = "Model name the API reports and accepts (`--served-model-name`).";
        };
        apiKeyFile = mkOption {
          type = types.nullOr types.str;
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
          type = types.attrsOf types.str;
          default = { };
          example = {
            NCCL_DEBUG = "WARN";
          };
          description = "Extra environment variables for SGLang (not for the preflight probes).";
        };
        extraArgs = mkOption {
          type = types.listOf types.str;
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
          type = types.nullOr types.str;
          default = null;
          example = "dflash";
          description = ''
            Static user to run as (created as a system user). `null` runs under `DynamicUser`.
          '';
        };
        group = mkOption {
          type = types.nullOr types.str;
          default = config.user;
          defaultText = literalExpression "user";
          description = "Group of {option}`user` (created); only used when {option}`user` is set.";
        };
        cacheDir = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "/srv/hf-cache";
          description = ''
            Model download cache (`HF_HOME`). `null` uses systemd's `CacheDirectory`,
            `/var/cache/dflash-${name}`. Another directory is made writable with `ReadWritePaths`.
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
        loadFormat = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "dummy";
          description = "Weight format (`--load-format`); `dummy` gives random weights (smoke tests).";
        };
        draftLoadFormat = mkOption {
          type = types.nullOr types.str;
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
          type = types.nullOr types.str;
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

  unitOf = name: i: {
    description = "DFlash SGLang instance ${name} (${i.model})";
    wantedBy = unitData.install.WantedBy;
    # SGLang's first start compiles JIT kernels: nvcc comes from the stack's own wheels (serve
    # points CUDA_HOME at them), the host compiler it and tvm-ffi call (gcc, c++) from here.
    path = [ pkgs.stdenv.cc ];
    unitConfig = unitData.unit;
    serviceConfig =
      unitData.service
      // {
        ExecStart = "${dflashctl} serve --config ${settingsFile name i} --python ${pythonOf i}";
        TimeoutStartSec = "${toString (i.startTimeoutSec + unitData.timeoutStartMarginSec)}s";
      }
      // lib.optionalAttrs (i.apiKeyFile != null) {
        LoadCredential = "${unitData.apiKeyCredential}:${i.apiKeyFile}";
      }
      // lib.optionalAttrs (i.cacheDir != null) { ReadWritePaths = [ i.cacheDir ]; }
      // lib.optionalAttrs (i.user != null) {
        User = i.user;
        Group = i.group;
      };
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

  config = lib.mkIf (instances != { }) {
    assertions = lib.flatten (
      lib.mapAttrsToList (name: i: [
        {
          assertion = i.apiKeyFile == null || !lib.hasPrefix builtins.storeDir (toString i.apiKeyFile);
          message = "services.dflash.instances.${name}.apiKeyFile points into the Nix store, which every user can read; keep the key outside the store (e.g. /run/secrets).";
        }
      ]) instances
    );

    system.checks = [ validation ];

    systemd.services = lib.mapAttrs' (
      name: i: lib.nameValuePair "dflash-${name}" (unitOf name i)
    ) instances;

    users = lib.mkMerge (
      lib.mapAttrsToList (
        _: i:
        lib.mkIf (i.user != null) {
          users.${i.user} = {
            isSystemUser = true;
            inherit (i) group;
          };
          groups.${i.group} = { };
        }
      ) instances
    );

    networking.firewall.allowedTCPPorts = lib.concatLists (
      lib.mapAttrsToList (_: i: lib.optional i.openFirewall i.port) instances
    );
  };
}
