# An example fleet flake: three NixOS GPU hosts with the dflash module, for deploy-rs and colmena.
# Copy it next to your hosts' configurations; `nix flake check` runs deploy-rs' own checks.
# docs/fleet.md: `deploy .#gpu-a` (the canary host), then gpu-b and gpu-c one at a time.
{
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    dflash.url = "github:OWNER/dflash-stack";
    deploy-rs.url = "github:serokell/deploy-rs";
  };

  outputs =
    {
      nixpkgs,
      dflash,
      deploy-rs,
      ...
    }:
    let
      hosts = [
        {
          name = "gpu-a";
          hostname = "10.0.0.11";
        }
        {
          name = "gpu-b";
          hostname = "10.0.0.12";
        }
        {
          name = "gpu-c";
          hostname = "10.0.0.13";
        }
      ];
      # Every host: the module, its instances behind the router, rolled one at a time on a switch.
      hostModules = name: [
        ./hosts/${name}.nix
        dflash.nixosModules.dflash
        {
          services.dflash.router.enable = true;
          services.dflash.upgrade = "rolling";
          # the default, said here because the fleet depends on it: the switch (deploy-rs' activation,
          # colmena's apply) ends with the rollout's verdict and fails when the rollout stopped
          services.dflash.rollout.waitForVerdict = true;
        }
      ];
      nixosConfigurations = builtins.listToAttrs (
        map (h: {
          inherit (h) name;
          value = nixpkgs.lib.nixosSystem {
            system = "x86_64-linux";
            modules = hostModules h.name;
          };
        }) hosts
      );
      fleet = import ./fleet.nix {
        inherit hosts nixosConfigurations hostModules;
        nixpkgs = import nixpkgs { system = "x86_64-linux"; };
        activateNixos = system: deploy-rs.lib.${system}.activate.nixos;
      };
    in
    {
      inherit nixosConfigurations;
      inherit (fleet) deploy;
      colmena = fleet.colmena;
      checks = builtins.mapAttrs (_: lib: lib.deployChecks fleet.deploy) deploy-rs.lib;
    };
}
