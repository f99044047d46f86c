# The fix-ups found under overlays/fixups, and for each the systems whose real lock has that
# package (a fix-up for a package in no lock would never run).
let
  nixLib = import ../../nix/lib;
  lock = nixLib.lock.read ../../nix/python-lock.json;
  fixups = nixLib.fixups.discover ../../overlays/fixups;
in
builtins.mapAttrs (
  name: _:
  builtins.filter (system: lock.systems.${system}.packages ? ${name}) (nixLib.lock.systems lock)
) fixups
