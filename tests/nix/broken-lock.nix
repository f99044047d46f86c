# A lock with a dependency cycle (a <-> b) and a dependency it lacks (c -> gone): the two
# things the overlay refuses before building anything.
let
  nixLib = import ../../nix/lib;
  packages = nixLib.lock.packagesFor (nixLib.lock.read ../data/nix/broken-lock.json) "x86_64-linux";
in
{
  missing = nixLib.graph.missingDependencies packages;
  cyclic = nixLib.graph.cyclic packages;
  dNeeds = nixLib.graph.dependencyClosure packages "d";
}
