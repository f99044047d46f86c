# Lock versus spec: the fixture lock records the sha256 of tests/data/nix/stack.toml.
let
  inherit (import ../../nix/lib) spec;
in
{
  same = spec.check {
    lockFile = ../data/nix/lock.json;
    specFile = ../data/nix/stack.toml;
  };
  other = spec.check {
    lockFile = ../data/nix/lock.json;
    specFile = ../data/nix/other-stack.toml;
  };
}
