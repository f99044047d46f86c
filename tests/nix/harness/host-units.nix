# A NixOS host's dflash units as NixOS writes them, without nixpkgs: the host's configuration
# through nix/module.nix in tests/nix/harness/nixos-lite.nix, and each dflash-* entry of its
# systemd.services as NixOS writes the unit file (nix/lib/service-entry.nix's `written`, with
# systemd.globalEnvironment merged in as NixOS does). tests/nixos_host.py reads it:
#   nix-instantiate --eval --strict --json tests/nix/harness/host-units.nix \
#     --argstr hostJSON '{"services": {"dflash": {...}}}' [--argstr packagesJSON '{"dflash-env": "/nix/store/..."}']
# `packagesJSON` gives the store paths of the packages the module defaults to (pkgs.dflash-env,
# dflashctl, dflashHostCompiler, dflash-router-env); a file the module writes gets a store path
# that changes with its text, as pkgs.writeText's does.
{
  hostJSON,
  packagesJSON ? "{}",
}:
let
  serviceEntry = import ../../../nix/lib/service-entry.nix;
  stored = name: outPath: {
    type = "derivation";
    inherit name outPath;
  };
  byContent =
    name: text:
    stored name "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" text)}-${name}";
  paths = {
    dflash-env = "/nix/store/e1-dflash-env";
    dflashctl = "/nix/store/d1-dflashctl";
    dflashHostCompiler = "/nix/store/c1-gcc-wrapper";
    dflash-router-env = "/nix/store/r1-dflash-router-env";
  }
  // builtins.fromJSON packagesJSON;
  pkgs = builtins.mapAttrs stored paths // {
    lib = import ../../../nix/stand-in-lib.nix;
    writeText = name: text: byContent name text // { inherit text; };
    runCommand =
      name: _: script:
      byContent name script;
  };
  host = import ./nixos-lite.nix {
    inherit pkgs;
    modules = [
      ../../../nix/module.nix
      (builtins.fromJSON hostJSON)
    ];
  };
  inherit (host.config) systemd;
  dflash = builtins.filter (n: builtins.substring 0 7 n == "dflash-") (
    builtins.attrNames systemd.services
  );
in
{
  inherit (host) failedAssertions;
  units = builtins.listToAttrs (
    map (n: {
      name = "${n}.service";
      value = serviceEntry.written (
        systemd.services.${n}
        // {
          environment = systemd.globalEnvironment // systemd.services.${n}.environment;
        }
      );
    }) dflash
  );
}
