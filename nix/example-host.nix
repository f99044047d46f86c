# The host that checks.nixos-example evaluates: a container (no boot loader, no file systems)
# running one DFlash instance, written the way a user's configuration would be.
{ lib, ... }:
{
  boot.isContainer = true;
  system.stateVersion = lib.trivial.release;

  services.dflash.instances.qwen3 = {
    enable = true;
    model = "Qwen/Qwen3-8B";
    draftModel = "z-lab/Qwen3-8B-DFlash-b16";
    speculative.algorithm = "DFLASH";
    gpus = [ 0 ];
    port = 30000;
  };
}
