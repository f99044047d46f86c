# NixOS's `assertions` and `warnings` (nixos/modules/misc/assertions.nix): a failed assertion stops
# the build of the system with its message; warnings are printed while evaluating it.
{ lib, ... }:
{
  options = {
    assertions = lib.mkOption {
      type = lib.types.listOf lib.types.unspecified;
      internal = true;
      default = [ ];
      description = "{ assertion; message; } checked when the system is built.";
    };
    warnings = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      internal = true;
      default = [ ];
      description = "Messages printed while the system is evaluated.";
    };
  };
}
