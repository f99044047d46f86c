# nix/lib over the committed lock: what the overlay will build on each system.
let
  nixLib = import ../../nix/lib;
  lock = nixLib.lock.read ../../nix/python-lock.json;
  perSystem =
    system:
    let
      packages = nixLib.lock.packagesFor lock system;
      roots = nixLib.lock.rootsFor lock system;
      devRoots = nixLib.lock.devRootsFor lock system;
      names = builtins.attrNames packages;
      stackClosure = nixLib.graph.closure packages roots;
    in
    {
      count = builtins.length names;
      inherit roots devRoots;
      rootsMissing = builtins.filter (r: !(packages ? ${r})) (roots ++ devRoots);
      # Every locked package is reachable from the roots or the dev group: nothing extra gets built.
      unreachable = builtins.filter (
        n: !(builtins.elem n (nixLib.graph.closure packages (roots ++ devRoots)))
      ) names;
      # `dev` marks exactly what the stack's roots do not reach (the dev shell's additions).
      dev = builtins.filter (n: packages.${n}.dev) names;
      devMismatch = builtins.filter (n: packages.${n}.dev == builtins.elem n stackClosure) names;
      unfree = nixLib.license.unfreeNames packages;
      missing = nixLib.graph.missingDependencies packages;
      cyclic = nixLib.graph.cyclic packages;
      # Files whose fetchPypi arguments would ask for another name.
      notRoundTripping = builtins.filter (
        n: nixLib.wheel.fetchedName packages.${n}.fetchPypi != packages.${n}.file
      ) names;
      fetchPypi = {
        torch = packages.torch.fetchPypi;
        sglang-kernel = packages.sglang-kernel.fetchPypi;
        sglang = packages.sglang.fetchPypi;
      };
      torchDependencies = packages.torch.dependencies;
    };
in
{
  systems = nixLib.lock.systems lock;
  specMatches =
    (nixLib.spec.check {
      lockFile = ../../nix/python-lock.json;
      specFile = ../../nix/stack.toml;
    }).ok;
  x86_64-linux = perSystem "x86_64-linux";
  aarch64-linux = perSystem "aarch64-linux";
}
