# The only reader of nix/python-lock.json in Nix (schema: python/dflashctl/lockfile.py).
let
  wheel = import ./wheel.nix;
in
rec {
  version = 1;

  read =
    path:
    let
      data = builtins.fromJSON (builtins.readFile path);
    in
    if (data.version or null) != version then
      throw "dflash: ${toString path} is lock version ${toString (data.version or "?")}, this flake reads version ${toString version}; run `dflashctl lock`"
    else
      data;

  systems = lock: builtins.attrNames lock.systems;

  # name -> { name, version, file, size, sha256, dependencies, license, dev, fetchPypi } for one
  # Nix system; `dev` marks what only the dev group ([dependency-groups] dev) needs.
  packagesFor =
    lock: system:
    if !(lock.systems ? ${system}) then
      throw "dflash: the lock has no packages for ${system} (it covers ${builtins.concatStringsSep ", " (systems lock)}); add it to `systems` in nix/stack.toml and run `dflashctl lock`"
    else
      builtins.mapAttrs (name: p: {
        inherit name;
        inherit (p)
          version
          file
          size
          sha256
          dependencies
          ;
        license = p.license or "LicenseRef-Unknown";
        dev = p.dev or false;
        fetchPypi = wheel.fetchPypiArgs { inherit (p) file sha256; };
      }) lock.systems.${system}.packages;

  rootsFor = lock: system: lock.systems.${system}.roots or [ ];
  devRootsFor = lock: system: lock.systems.${system}.dev_roots or [ ];
}
