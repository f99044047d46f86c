# A fleet of NixOS GPU hosts for deploy-rs and colmena, upgraded host by host with the first host as
# the canary host (docs/fleet.md). Builtins only: tests/nix/test_fleet_nix.py evaluates it offline with
# stand-ins for deploy-rs' activate function and for the hosts' configurations.
#
#   hosts                list of { name; hostname; system ? "x86_64-linux"; }, in upgrade order: the
#                        first is the canary host
#   nixosConfigurations  name -> the host's nixosSystem (deploy-rs)
#   activateNixos        system -> configuration -> profile path: deploy-rs.lib.${system}.activate.nixos
#   hostModules          name -> the host's modules (colmena builds each host from its modules)
#   nixpkgs              colmena's meta.nixpkgs
#   rolloutSec           how long one host's rollout may take (its instances one at a time, each
#                        restarted, proven and held): deploy-rs waits this long for the activation
{
  hosts,
  nixosConfigurations ? { },
  activateNixos ? null,
  hostModules ? (_: [ ]),
  nixpkgs ? null,
  rolloutSec ? 1800,
}:
let
  names = map (h: h.name) hosts;
  canary = builtins.head names;
  systemOf = h: h.system or "x86_64-linux";
  tagsOf = h: if h.name == canary then [ "canary" ] else [ "fleet" ];
in
{
  inherit canary;
  order = names;

  # `deploy .#<canary>` first, then the rest one after the other (docs/fleet.md has the commands).
  # switch-to-configuration returns only once the host's rollout has finished
  # (services.dflash.rollout.waitForVerdict, on by default); a stopped rollout makes the activation fail, and autoRollback activates the previous
  # generation again. magicRollback also reverts a host that the deploying machine cannot reach after
  # the switch.
  deploy = {
    sshUser = "root";
    user = "root";
    autoRollback = true;
    magicRollback = true;
    # The activation is the switch plus the rollout: well above deploy-rs' default of 240 s.
    activationTimeout = rolloutSec;
    nodes = builtins.listToAttrs (
      map (h: {
        inherit (h) name;
        value = {
          inherit (h) hostname;
          profiles.system.path = activateNixos (systemOf h) nixosConfigurations.${h.name};
        };
      }) hosts
    );
  };

  # colmena's hive: `colmena apply --on @canary`, then each host of @fleet in turn.
  colmena = {
    meta = {
      inherit nixpkgs;
      nodeNixpkgs = builtins.listToAttrs (
        map (h: {
          inherit (h) name;
          value = nixpkgs;
        }) hosts
      );
    };
  }
  // builtins.listToAttrs (
    map (h: {
      inherit (h) name;
      value = {
        deployment = {
          targetHost = h.hostname;
          targetUser = "root";
          tags = tagsOf h;
        };
        imports = hostModules h.name;
      };
    }) hosts
  );
}
