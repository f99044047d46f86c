# nixpkgs' `lib` as far as overlays/build-wheel.nix and the fix-ups use it: the audit's stand-in.
import ../../../nix/stand-in-lib.nix
