# The prebuilt-kernel option of services.dflash, kept beside nix/module.nix (imported with it by
# the flake's nixosModules.dflash). The module passes it to every instance as the environment
# variable DFLASH_PREBUILT_KERNELS (an instance's own `environment` wins); `dflashctl serve` then
# loads SGLang's JIT kernels from it read-only and compiles only what it lacks into the instance's
# cache directory.
{ lib, ... }:
{
  options.services.dflash.kernelsPackage = lib.mkOption {
    type = lib.types.nullOr lib.types.package;
    default = null;
    defaultText = lib.literalExpression "dflash.packages.\${system}.dflash-kernels";
    example = lib.literalExpression ''dflash.packages.''${system}.dflash-kernels.override { cudaArchs = [ "sm120" ]; }'';
    description = ''
      SGLang's JIT kernels built ahead without a GPU (`dflashctl kernels build`), given to every
      instance as `DFLASH_PREBUILT_KERNELS`: a first start loads them instead of compiling for about a
      minute. A kernel the package lacks (another GPU arch, another model shape, a patched SGLang) is
      compiled into the instance's cache directory at the first start, as without it. `null`: every
      host compiles its own at the first start.
    '';
  };
}
