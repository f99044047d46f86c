# nix/lib over the small fixture lock (tests/data/nix/lock.json), per system.
let
  nixLib = import ../../nix/lib;
  lock = nixLib.lock.read ../data/nix/lock.json;
  perSystem =
    system:
    let
      packages = nixLib.lock.packagesFor lock system;
      roots = nixLib.lock.rootsFor lock system;
    in
    {
      inherit packages roots;
      rootClosure = nixLib.graph.closure packages roots;
      torchNeeds = nixLib.graph.dependencyClosure packages "torch";
      missing = nixLib.graph.missingDependencies packages;
      cyclic = nixLib.graph.cyclic packages;
    };
in
{
  systems = nixLib.lock.systems lock;
  x86_64-linux = perSystem "x86_64-linux";
  aarch64-linux = perSystem "aarch64-linux";
}
