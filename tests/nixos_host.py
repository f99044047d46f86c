"""A NixOS host's dflash units as NixOS would write them, from the module's pure functions (no nixpkgs).

For the tests of what `nixos-rebuild switch` does (tests/nixos_switch.py has the rule): the router's
unit (nix/lib/router-unit.nix) with its triggers as NixOS renders reloadTriggers/restartTriggers
([Unit] X-Reload-Triggers / X-Restart-Triggers), each instance's unit (nix/lib/service-unit.nix
through tests/nix_unit.py) with the [Service] X-RestartIfChanged=false NixOS writes for
restartIfChanged = false, and dflash-rollout.service (nix/lib/rollout-unit.nix) for upgrade =
"rolling". A trigger list stands for the store path NixOS writes it to: equal exactly when it is.
"""

import json
from pathlib import Path

import nix_unit
from conftest import nix_or_skip
from dflashctl.operations import router
from nixeval import eval_expr, unit_sections

REPO = Path(__file__).resolve().parent.parent
ROUTER_LIB = REPO / "nix" / "lib" / "router-unit.nix"
ROLLOUT_LIB = REPO / "nix" / "lib" / "rollout-unit.nix"
SERVICE_LIB = REPO / "nix" / "lib" / "service-unit.nix"


def router_options(given: dict) -> dict:
    """Every services.dflash.router setting, as the module passes them (defaults from the data file)."""
    base = {**router.defaults(), "apiKeyFile": None, "adminApiKeyFile": None, "logLevel": "info",
            "extraArgs": [], "remoteWorkers": [], "enable": True, "openFirewall": False}
    return {**base, **given}


def nix_router(given: dict, instances: dict) -> dict:
    """(settings, failed assertion messages) of the pure functions for `instances` (name -> options)."""
    nix = nix_or_skip()
    full = {n: nix_unit.full_options(n, o) for n, o in instances.items()}
    lib = ROUTER_LIB
    expr = (f"let r = import {lib}; o = builtins.fromJSON {json.dumps(json.dumps(router_options(given)))};"
            f" i = builtins.fromJSON {json.dumps(json.dumps(full))}; in {{ settings = r.settings o i;"
            " failed = map (a: a.message) (builtins.filter (a: !a.assertion) (r.assertions o i)); }")
    return eval_expr(nix, expr)


def nixos_router_unit(given: dict, instances: dict, python: str = "/nix/store/r-router-env/bin/python",
                      dflashctl: str = "/nix/store/d-dflashctl/bin/dflashctl") -> dict:
    """dflash-router.service as NixOS writes it from the module's data: nix/lib/router-unit.nix's
    directives for `instances` (name -> options) and services.dflash.router `given`, and its
    triggers as NixOS renders reloadTriggers/restartTriggers ([Unit] X-Reload-Triggers /
    X-Restart-Triggers)."""
    full = {n: nix_unit.full_options(n, o) for n, o in instances.items()}
    lib = ROUTER_LIB
    expr = (f"let r = import {lib}; o = builtins.fromJSON {json.dumps(json.dumps(router_options(given)))};"
            f" i = builtins.fromJSON {json.dumps(json.dumps(full))}; s = r.settings o i;"
            f' d = r.directives {{ settings = s; dflashctl = "{dflashctl}"; python = "{python}";'
            ' settingsFile = "/etc/dflash-router.json"; }; t = r.triggers s; in'
            ' { Unit = d.Unit // { X-Reload-Triggers = t.reload; X-Restart-Triggers = t.restart; };'
            ' Service = d.Service; }')
    return unit_sections(nix_or_skip(), expr)


def _lines(v) -> list[str]:
    v = v if isinstance(v, list) else [v]
    return ["true" if x is True else "false" if x is False else str(x) for x in v]


def _parsed(d: dict) -> dict[str, dict[str, list[str]]]:
    return {sec: {k: _lines(v) for k, v in vals.items()} for sec, vals in d.items()}


def settings_path(name: str, settings: dict) -> str:
    """The store path pkgs.writeText gives an instance's settings: it changes with what it holds."""
    import hashlib
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]
    return f"/nix/store/{digest}-dflash-{name}.json"


def host_units(instances: dict, router_given: dict | None, upgrade: str,
               python: str = "/nix/store/e1-dflash-env/bin/python",
               dflashctl: str = "/nix/store/d1-dflashctl/bin/dflashctl", rollout: dict | None = None) -> dict:
    """unit name -> the unit as NixOS writes it, for a host with `instances` (name -> options), the
    router when `router_given` is not None, and services.dflash.upgrade `upgrade`."""
    full = {n: nix_unit.full_options(n, o) for n, o in instances.items()}
    files = {n: settings_path(n, o) for n, o in full.items()}
    result = nix_unit.evaluate_many([{"instances": full, "python": python, "dflashctl": dflashctl,
                                      "settingsFiles": files}])[0][0]
    assert result["failedAssertions"] == [], result["failedAssertions"]
    units, directives = {}, {}
    for name, got in result["units"].items():
        d = got["directives"]
        directives[name] = d
        unit = _parsed({"Unit": d["Unit"], "Service": d["Service"]})
        if upgrade == "rolling":  # restartIfChanged = false, as systemd-lib.nix's serviceToUnit writes it
            unit["Service"]["X-RestartIfChanged"] = ["false"]
        units[f"dflash-{name}.service"] = unit
    if router_given is not None:
        units["dflash-router.service"] = nixos_router_unit(router_given, instances, dflashctl=dflashctl)
    if upgrade == "rolling":
        units["dflash-rollout.service"] = rollout_unit(full, directives, rollout or {}, router_given is not None,
                                                       dflashctl)
    return units


def rollout_unit(full: dict, directives: dict, rollout: dict, router_on: bool, dflashctl: str) -> dict:
    """dflash-rollout.service from nix/lib/rollout-unit.nix, its restartTriggers as NixOS writes them."""
    options = {"batch": 1, "healthyForSec": 10, "requireIdentical": False, **rollout}
    instances_file = settings_path("instances", full)
    router_file = '"/etc/dflash-router.json"' if router_on else "null"
    args = {"full": full, "directives": directives, "options": options}
    expr = (f"let r = import {ROLLOUT_LIB}; a = builtins.fromJSON {json.dumps(json.dumps(args))};"
            f' d = r.directives {{ dflashctl = "{dflashctl}"; instancesFile = "{instances_file}";'
            f" routerSettingsFile = {router_file}; instances = a.full; instanceDirectives = a.directives;"
            " rollout = a.options; };"
            " in { Unit = d.Unit // { X-Restart-Triggers = d.restartTriggers; }; Service = d.Service; }")
    return _parsed(eval_expr(nix_or_skip(), expr))

