# The remaining NixOS options the dflash module sets: `system.checks` (packages the system's build
# depends on: a failing one fails `nixos-rebuild`) and the firewall's open TCP ports.
{ lib, ... }:
{
  options = {
    system.checks = lib.mkOption {
      type = lib.types.listOf lib.types.package;
      default = [ ];
      description = "Derivations built with the system, to validate its configuration.";
    };
    networking.firewall.allowedTCPPorts = lib.mkOption {
      type = lib.types.listOf lib.types.port;
      default = [ ];
      description = "TCP ports open in the firewall.";
    };
  };
}
