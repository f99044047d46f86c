# The flake's `dflash-smoke` app built with tests/data/flake/stub-nixpkgs: the program's path.
{
  system ? "x86_64-linux",
}:
let
  flake = import ../../../flake.nix;
  outputs = flake.outputs {
    self = outputs;
    nixpkgs = ./stub-nixpkgs;
  };
in
outputs.apps.${system}.dflash-smoke.program
