"""deploy/nixos/fleet.nix evaluated offline: deploy-rs' nodes and colmena's hive for a fleet whose
first host is the canary host. deploy-rs' activate function and the hosts' configurations are
stand-ins that record what they were given (evaluating a nixosSystem needs nixpkgs); what is held is
what each tool reads: node names and addresses, the profile each node activates, the rollback and
timeout settings, colmena's targets and the canary tag, and the order."""

import pytest

from conftest import REPO, nix_or_skip
from nixeval import eval_expr

pytestmark = pytest.mark.nix
FLEET = REPO / "deploy" / "nixos" / "fleet.nix"
HOSTS = ('[ { name = "gpu-b"; hostname = "10.0.0.12"; } { name = "gpu-a"; hostname = "10.0.0.11"; } '
         '{ name = "gpu-c"; hostname = "10.0.0.13"; system = "aarch64-linux"; } ]')


def fleet(extra: str = "") -> dict:
    expr = f"""import {FLEET} {{
      hosts = {HOSTS};
      nixosConfigurations = builtins.listToAttrs (map (n: {{ name = n; value = {{ configOf = n; }}; }})
        [ "gpu-a" "gpu-b" "gpu-c" ]);
      activateNixos = system: cfg: {{ activated = cfg.configOf; inherit system; }};
      hostModules = name: [ "modules-of-${{name}}" ];
      nixpkgs = "stand-in nixpkgs";
      {extra}
    }}"""
    return eval_expr(nix_or_skip(), expr)


def test_deploy_rs_nodes_activate_each_host_with_rollback_and_room_for_the_rollout():
    out = fleet()
    deploy = out["deploy"]
    assert set(deploy["nodes"]) == {"gpu-a", "gpu-b", "gpu-c"}
    assert deploy["nodes"]["gpu-c"] == {"hostname": "10.0.0.13", "profiles": {"system": {
        "path": {"activated": "gpu-c", "system": "aarch64-linux"}}}}
    assert deploy["nodes"]["gpu-b"]["profiles"]["system"]["path"] == {"activated": "gpu-b", "system": "x86_64-linux"}
    assert deploy["autoRollback"] is True and deploy["magicRollback"] is True
    assert deploy["user"] == "root" and deploy["activationTimeout"] == 1800  # far above deploy-rs' 240 s
    assert fleet("rolloutSec = 600;")["deploy"]["activationTimeout"] == 600


def test_the_first_host_is_the_canary_host_in_both_tools():
    out = fleet()
    assert out["canary"] == "gpu-b" and out["order"] == ["gpu-b", "gpu-a", "gpu-c"]  # the list's order, not names'
    hive = out["colmena"]
    assert hive["gpu-b"]["deployment"] == {"targetHost": "10.0.0.12", "targetUser": "root", "tags": ["canary"]}
    assert [hive[n]["deployment"]["tags"] for n in ("gpu-a", "gpu-c")] == [["fleet"], ["fleet"]]
    assert hive["gpu-a"]["imports"] == ["modules-of-gpu-a"]
    assert hive["meta"]["nixpkgs"] == "stand-in nixpkgs" and set(hive["meta"]["nodeNixpkgs"]) == {"gpu-a", "gpu-b", "gpu-c"}


def test_the_example_flake_feeds_fleet_nix_the_same_hosts():
    """deploy/nixos/flake.nix needs its inputs (nixpkgs, deploy-rs): read, not evaluated here; its
    hosts list evaluates through fleet.nix (tier 2's nix flake check of a real fleet does the rest)."""
    text = (REPO / "deploy" / "nixos" / "flake.nix").read_text()
    assert "import ./fleet.nix" in text and "deploy-rs.lib.${system}.activate.nixos" in text
    assert "deployChecks fleet.deploy" in text and 'services.dflash.upgrade = "rolling"' in text
