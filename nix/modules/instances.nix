# services.dflash.instances: SGLang + DFlash instances, one systemd unit each (dflash-<name>.service),
# the packages they run, and what each needs on the host (a static user, a cache directory, the
# firewall). What decides a unit (its directives from the data file `dflashctl unit` renders from,
# escaping, credentials, cache directories, its digest), the refusals and warnings that need no
# package and the settings file are pure functions in ../lib/service-unit.nix, which tier 1
# evaluates without nixpkgs; this module declares the options and wires those into NixOS.
args@{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  inherit (import ./shared.nix args)
    cfg
    instances
    dflashctl
    pythonOf
    unitName
    unitStr
    settingsFile
    allSettings
    instanceEntry
    ;
  serviceUnit = import ../lib/service-unit.nix;
  serviceEntry = import ../lib/service-entry.nix;
  settings = import ../lib/settings.nix;

  # The names NixOS accepts for users and groups.
  accountName = types.strMatching "[a-zA-Z0-9_.][a-zA-Z0-9_.-]*";
  # The primary group a static user runs with (NixOS picks it when the instance names none).
  groupOf = i: if i.group != null then i.group else config.users.users.${i.user}.group;

  instanceOptions =
    { name, ... }:
    {
      # The settings dflashctl reads, declared from its schema (../lib/settings.nix); the
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

    # Each instance's unit is its entry, whole; directives at mkDefault, so a host can override
    # any of them (outside the digest: docs/nix.md). How a switch treats it: ./rollout.nix.
    systemd.services = lib.mapAttrs' (
      name: i:
      lib.nameValuePair (unitName name) (serviceEntry.withDefaults lib.mkDefault (instanceEntry name i))
    ) instances;

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
            isSystemUser = lib.mkDefault (!config.users.users.${i.user}.isNormalUser);
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
}
