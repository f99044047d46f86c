# Minimal declarations of our own of the NixOS options nix/module.nix (and checks.nixos-vm's hosts)
# set or read, for the real module system of a nixpkgs lib found outside the repository
# (tests/nix/harness/module-eval.nix, tests/nix/harness/vm-nodes.nix). Written from the NixOS manual:
# lists merge, `isNormalUser` puts a user in the group "users", a service's `path` becomes the PATH
# of its `environment`, systemd.globalEnvironment is written into every unit.
lib:
let
  inherit (lib) mkOption types;
  listOption =
    type:
    mkOption {
      type = types.listOf type;
      default = [ ];
    };
in
{
  options = {
    assertions = listOption types.unspecified;
    warnings = listOption types.str;
    system.checks = listOption types.unspecified;
    systemd.tmpfiles.rules = listOption types.str;
    networking.firewall.allowedTCPPorts = listOption types.port;
    environment.systemPackages = listOption types.package;
    # NixOS evaluates each specialisation as a system of its own; here it is only carried.
    specialisation = mkOption {
      type = types.attrsOf types.unspecified;
      default = { };
    };
    # Written into every unit (NixOS: LOCALE_ARCHIVE, TZDIR from i18n and time).
    systemd.globalEnvironment = mkOption {
      type = types.attrsOf types.str;
      default = { };
    };
    systemd.services = mkOption {
      default = { };
      type = types.attrsOf (
        types.submodule (
          { config, ... }:
          {
            options = {
              description = mkOption {
                type = types.str;
                default = "";
              };
              after = listOption types.str;
              before = listOption types.str;
              wants = listOption types.str;
              wantedBy = listOption types.str;
              path = listOption types.unspecified;
              environment = mkOption {
                type = types.attrsOf types.str;
                default = { };
              };
              reloadTriggers = listOption types.unspecified;
              restartTriggers = listOption types.unspecified;
              restartIfChanged = mkOption {
                type = types.bool;
                default = true;
              };
              unitConfig = mkOption {
                type = types.attrsOf types.unspecified;
                default = { };
              };
              serviceConfig = mkOption {
                type = types.attrsOf types.unspecified;
                default = { };
              };
            };
            # As NixOS defines it for every service: PATH from `path` (bin, then sbin).
            config.environment.PATH = lib.mkIf (config.path != [ ]) (
              lib.concatStringsSep ":" (map (p: "${p}/bin") config.path ++ map (p: "${p}/sbin") config.path)
            );
          }
        )
      );
    };
    # services.dflash.prometheus and .grafana add to these where the host enables them.
    services.prometheus = {
      enable = mkOption {
        type = types.bool;
        default = false;
      };
      port = mkOption {
        type = types.port;
        default = 9090;
      };
      scrapeConfigs = listOption types.unspecified;
      ruleFiles = listOption types.path;
      exporters = mkOption {
        type = types.attrsOf (
          types.submodule {
            options.enable = mkOption {
              type = types.bool;
              default = false;
            };
            options.port = mkOption { type = types.port; };
          }
        );
        default = { };
      };
    };
    services.grafana = {
      enable = mkOption {
        type = types.bool;
        default = false;
      };
      provision.enable = mkOption {
        type = types.bool;
        default = false;
      };
      provision.dashboards.settings.providers = listOption types.unspecified;
    };
    environment.etc = mkOption {
      type = types.attrsOf (types.submodule { options.source = mkOption { type = types.path; }; });
      default = { };
    };
    users.groups = mkOption {
      type = types.attrsOf (types.submodule { });
      default = { };
    };
    users.users = mkOption {
      default = { };
      type = types.attrsOf (
        types.submodule (
          { config, ... }:
          {
            options = {
              isSystemUser = mkOption {
                type = types.bool;
                default = false;
              };
              isNormalUser = mkOption {
                type = types.bool;
                default = false;
              };
              group = mkOption {
                type = types.str;
                default = "";
              };
            };
            config.group = lib.mkIf config.isNormalUser (lib.mkDefault "users");
          }
        )
      );
    };
  };
}
