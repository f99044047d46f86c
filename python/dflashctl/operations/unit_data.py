"""The operations' own data files (data/): the router's and the rollout's unit directives, the canary's defaults.

nix/lib/router-unit.nix and nix/lib/rollout-unit.nix read the same files, so `dflashctl router-unit`
and the NixOS module give one unit (tests/operations/test_router.py, test_rollout_unit.py).
"""

import json
from functools import cache
from pathlib import Path

DATA = Path(__file__).with_name("data")


@cache
def _read(name: str) -> str:
    return (DATA / name).read_text()


def router_unit_data() -> dict:
    """router-unit.json: the router unit's directives and the router settings' defaults."""
    return json.loads(_read("router-unit.json"))


def rollout_unit_data() -> dict:
    """rollout-unit.json: dflash-rollout.service's directives (its StateDirectory holds the rollout's state)."""
    return json.loads(_read("rollout-unit.json"))


def canary_data() -> dict:
    """canary.json: the canary's defaults and bounds, what may be expected to change, the identity fields."""
    return json.loads(_read("canary.json"))
