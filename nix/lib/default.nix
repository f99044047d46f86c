# Pure functions over the lock (builtins only, so tier 1 evaluates them offline with `nix eval`).
# Data flows one way: nix/python-lock.json -> lock.packagesFor -> overlays/ -> dflash-env.
{
  wheel = import ./wheel.nix;
  lock = import ./lock.nix;
  graph = import ./graph.nix;
  spec = import ./spec.nix;
  fixups = import ./fixups.nix;
  pyproject = import ./pyproject.nix;
  license = import ./license.nix;
}
