# Reduced declarations of NixOS's `systemd.services`, `systemd.units`, `systemd.tmpfiles.rules` and
# `systemd.globalEnvironment`, written for the module tests from nixos/modules/system/boot/systemd.nix,
# nixos/lib/systemd-unit-options.nix, nixos/lib/systemd-lib.nix and nixos/lib/systemd-types.nix:
# the options a service unit has, with their real types and the config NixOS derives from them
# ([Unit] directives from the list options, PATH from `path`, the default PATH), and the unit text.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types;
  sd = import ./systemd-lib.nix { inherit lib; };
  cfg = config.systemd;
  unitList =
    description:
    mkOption {
      default = [ ];
      type = types.listOf sd.unitNameType;
      inherit description;
    };

  serviceModule =
    {
      name,
      config,
      options,
      ...
    }:
    {
      options = {
        enable = mkOption {
          type = types.bool;
          default = true;
          description = "If false, the unit is a link to /dev/null.";
        };
        description = mkOption {
          type = types.singleLineStr;
          default = "";
          description = "Description= of the unit.";
        };
        documentation = mkOption {
          type = types.listOf types.str;
          default = [ ];
          description = "Documentation=.";
        };
        requires = unitList "Requires=.";
        wants = unitList "Wants=.";
        after = unitList "After=.";
        before = unitList "Before=.";
        bindsTo = unitList "BindsTo=.";
        partOf = unitList "PartOf=.";
        conflicts = unitList "Conflicts=.";
        requisite = unitList "Requisite=.";
        onFailure = unitList "OnFailure=.";
        wantedBy = unitList "Units that want this one (.wants links and [Install] WantedBy=).";
        requiredBy = unitList "Units that require this one.";
        unitConfig = mkOption {
          type = types.attrsOf sd.unitOption;
          default = { };
          description = "[Unit] directives.";
        };
        startLimitBurst = mkOption {
          type = types.int;
          description = "StartLimitBurst= (no default: rendered only when defined).";
        };
        startLimitIntervalSec = mkOption {
          type = types.int;
          description = "StartLimitIntervalSec= (no default: rendered only when defined).";
        };
        restartTriggers = mkOption {
          type = types.listOf types.unspecified;
          default = [ ];
          description = "Restart the unit on a switch when these change.";
        };
        restartIfChanged = mkOption {
          type = types.bool;
          default = true;
          description = "Restart on a switch when the unit changes.";
        };
        environment = mkOption {
          type =
            with types;
            attrsOf (
              nullOr (oneOf [
                str
                path
                package
              ])
            );
          default = { };
          description = "Environment= of the service's processes.";
        };
        path = mkOption {
          type =
            with types;
            listOf (oneOf [
              package
              str
            ]);
          default = [ ];
          description = "Packages whose bin and sbin go on PATH.";
        };
        serviceConfig = mkOption {
          type = types.addCheck (types.attrsOf sd.unitOption) sd.checkService;
          default = { };
          description = "[Service] directives.";
        };
        script = mkOption {
          type = types.lines;
          default = "";
          description = "Shell commands run as the main process.";
        };
      };

      config = {
        unitConfig =
          lib.optionalAttrs (config.requires != [ ]) { Requires = toString config.requires; }
          // lib.optionalAttrs (config.wants != [ ]) { Wants = toString config.wants; }
          // lib.optionalAttrs (config.after != [ ]) { After = toString config.after; }
          // lib.optionalAttrs (config.before != [ ]) { Before = toString config.before; }
          // lib.optionalAttrs (config.bindsTo != [ ]) { BindsTo = toString config.bindsTo; }
          // lib.optionalAttrs (config.partOf != [ ]) { PartOf = toString config.partOf; }
          // lib.optionalAttrs (config.conflicts != [ ]) { Conflicts = toString config.conflicts; }
          // lib.optionalAttrs (config.requisite != [ ]) { Requisite = toString config.requisite; }
          // lib.optionalAttrs (config.description != "") { Description = config.description; }
          // lib.optionalAttrs (config.documentation != [ ]) {
            Documentation = toString config.documentation;
          }
          // lib.optionalAttrs (config.onFailure != [ ]) { OnFailure = toString config.onFailure; }
          // lib.optionalAttrs options.startLimitIntervalSec.isDefined {
            StartLimitIntervalSec = toString config.startLimitIntervalSec;
          }
          // lib.optionalAttrs options.startLimitBurst.isDefined {
            StartLimitBurst = toString config.startLimitBurst;
          };
        # stage 2 services: a minimal default PATH after the service's own packages.
        path = lib.mkAfter [
          pkgs.coreutils
          pkgs.findutils
          pkgs.gnugrep
          pkgs.gnused
          pkgs.systemd
        ];
        environment.PATH =
          lib.mkIf (config.path != [ ])
            "${lib.makeBinPath config.path}:${lib.makeSearchPathOutput "bin" "sbin" config.path}";
        serviceConfig = lib.mkIf (config.script != "") {
          ExecStart = "${pkgs.writeText "${name}-start" config.script}";
        };
      };
    };
in
{
  options.systemd = {
    services = mkOption {
      type = types.attrsOf (types.submodule serviceModule);
      default = { };
      description = "Service units.";
    };
    globalEnvironment = mkOption {
      type =
        with types;
        attrsOf (
          nullOr (oneOf [
            str
            path
            package
          ])
        );
      default = { };
      description = "Environment of every unit.";
    };
    tmpfiles.rules = mkOption {
      type = types.listOf types.str;
      default = [ ];
      description = "tmpfiles.d(5) lines.";
    };
    units = mkOption {
      type = types.attrsOf (
        types.submodule {
          options = {
            text = mkOption {
              type = types.nullOr types.str;
              default = null;
              description = "The unit file.";
            };
            wantedBy = mkOption {
              type = types.listOf sd.unitNameType;
              default = [ ];
              description = "Units that want this one.";
            };
            enable = mkOption {
              type = types.bool;
              default = true;
              description = "Whether the unit is linked.";
            };
          };
        }
      );
      default = { };
      description = "Unit files by name.";
    };
  };

  config = {
    systemd.units = lib.mapAttrs' (
      n: v:
      lib.nameValuePair "${n}.service" {
        text = sd.serviceToUnitText cfg.globalEnvironment v;
        inherit (v) wantedBy enable;
      }
    ) cfg.services;

    assertions = lib.concatLists (
      lib.mapAttrsToList (
        name: service:
        lib.optional
          (service.serviceConfig.Type or "" == "oneshot" && service.serviceConfig.Restart or "no" != "no")
          {
            assertion = false;
            message = "Service '${name}.service' with 'Type=oneshot' cannot have 'Restart=always' or 'Restart=on-success'";
          }
      ) cfg.services
    );
  };
}
