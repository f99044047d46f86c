# nix/vm-test.nix with a stub nixpkgs and flake, evaluated offline (tests/nix/test_unit_nix.py): the
# hosts the VM test boots and the script it runs, without booting anything.
#   nix-instantiate --eval --strict --json --read-write-mode tests/nix/harness/vm-test.nix
let
  system = "x86_64-linux";
  pkgs = {
    stdenv.hostPlatform.system = system;
    python312 = {
      interpreter = "/stub/python3";
      pkgs.packaging = "nixpkgs-packaging";
      withPackages = f: {
        outPath = "/stub/python-env";
        packages = f { };
      };
    };
    callPackage = fn: args: {
      outPath = "/stub/${baseNameOf fn}";
      inherit (args) packaging;
    };
    curl = "curl";
    writeShellScriptBin = name: text: { inherit name text; };
    writeText = name: text: "/stub/${name}";
    runCommand = name: _: script: { inherit name script; };
    testers.runNixOSTest = args: args;
  };
  self = {
    packages.${system}.dflashctl = "/stub/dflashctl";
    nixosModules.dflash = "the flake's module";
  };
  test = import ../../../nix/vm-test.nix { inherit pkgs self; };
in
{
  inherit (test) name testScript;
  # A node is the host's module, or one importing it with more of its own (the upgraded hosts).
  nodes = builtins.mapAttrs (
    _: node:
    let
      base = if node.imports == [ "the flake's module" ] then node else builtins.head node.imports;
    in
    {
      inherit (base) imports;
      inherit (base.services.dflash)
        package
        dflashctlPackage
        kernelsPackage
        ;
      instances = base.services.dflash.instances // (node.services.dflash.instances or { });
      upgrade = node.services.dflash.upgrade or null;
      specialisations = builtins.mapAttrs (_: s: s.configuration.services.dflash.instances) (
        node.specialisation or { }
      );
    }
  ) test.nodes;
}
