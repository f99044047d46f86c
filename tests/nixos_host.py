"""A NixOS host's dflash units as NixOS would write them, without nixpkgs.

For the tests of what `nixos-rebuild switch` does (tests/nixos_switch.py has the rule). `host_units`:
the host's configuration through nix/module.nix itself, evaluated by tests/nix/harness/nixos-lite.nix
(tests/nix/harness/host-units.nix), every dflash unit as NixOS writes it from its systemd.services
entry: the router's with its triggers ([Unit] X-Reload-Triggers / X-Restart-Triggers), each
instance's with the Environment= lines NixOS makes of `path` and systemd.globalEnvironment and,
for upgrade = "rolling", X-RestartIfChanged=false, and dflash-rollout.service. A trigger list stands
for the store path NixOS writes it to: equal exactly when it is. `nixos_router_unit`: the router's
unit from nix/lib/router-unit.nix's functions alone.
"""

import json
import subprocess
from pathlib import Path

import nix_unit
from conftest import nix_or_skip
from dflashctl.operations import router
from nixeval import eval_expr, nix_env, unit_sections

REPO = Path(__file__).resolve().parent.parent
ROUTER_LIB = REPO / "nix" / "lib" / "router-unit.nix"
SERVICE_ENTRY = REPO / "nix" / "lib" / "service-entry.nix"
HOST_UNITS = REPO / "tests" / "nix" / "harness" / "host-units.nix"


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
    """dflash-router.service as NixOS writes it from nix/lib/router-unit.nix's entry for `instances`
    (name -> options) and services.dflash.router `given`: its directives, and its triggers as NixOS
    renders reloadTriggers/restartTriggers ([Unit] X-Reload-Triggers / X-Restart-Triggers)."""
    full = {n: nix_unit.full_options(n, o) for n, o in instances.items()}
    expr = (f"let r = import {ROUTER_LIB}; e = import {SERVICE_ENTRY};"
            f" o = builtins.fromJSON {json.dumps(json.dumps(router_options(given)))};"
            f" i = builtins.fromJSON {json.dumps(json.dumps(full))};"
            f' w = e.written (r.entry {{ settings = r.settings o i; dflashctl = "{dflashctl}";'
            f' python = "{python}"; settingsFile = "/etc/dflash-router.json"; }});'
            " in { inherit (w) Unit Service; }")
    return unit_sections(nix_or_skip(), expr)


def _lines(v) -> list[str]:
    v = v if isinstance(v, list) else [v]
    return ["true" if x is True else "false" if x is False else str(x) for x in v]


def _parsed(d: dict) -> dict[str, dict[str, list[str]]]:
    return {sec: {k: _lines(v) for k, v in vals.items()} for sec, vals in d.items()}


def host_config(instances: dict, router_given: dict | None, upgrade: str, rollout: dict | None = None,
                **more) -> dict:
    """A host's configuration as JSON: services.dflash with `instances` (name -> options as a host
    writes them), the router when `router_given` is not None, `upgrade`, services.dflash.rollout;
    `more`: other top-level definitions (systemd, ...)."""
    dflash = {"instances": instances, "upgrade": upgrade, "rollout": rollout or {}}
    if router_given is not None:
        dflash["router"] = {"enable": True, **router_given}
    return {"services": {"dflash": dflash}, **more}


def evaluate_host(host: dict, packages: dict | None = None) -> dict:
    """unit name -> {section: {directive: value}} as NixOS writes each dflash unit of `host` (a
    configuration as JSON); `packages`: store paths of the packages the module defaults to
    (dflash-env, dflashctl, dflashHostCompiler, dflash-router-env). NixOS's failed assertions fail."""
    nix_or_skip()
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", str(HOST_UNITS),
                        "--argstr", "hostJSON", json.dumps(host), "--argstr", "packagesJSON",
                        json.dumps(packages or {})], capture_output=True, text=True, env=nix_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["failedAssertions"] == [], out["failedAssertions"]
    return out["units"]


def host_units(instances: dict, router_given: dict | None, upgrade: str,
               python: str = "/nix/store/e1-dflash-env/bin/python",
               dflashctl: str = "/nix/store/d1-dflashctl/bin/dflashctl", rollout: dict | None = None) -> dict:
    """unit name -> the unit as NixOS writes it, parsed as tests/nixos_switch.py reads it ([Install]
    left out), for a host with `instances` (name -> options), the router when `router_given` is not
    None, and services.dflash.upgrade `upgrade`."""
    packages = {"dflash-env": python.removesuffix("/bin/python"),
                "dflashctl": dflashctl.removesuffix("/bin/dflashctl")}
    return parsed(evaluate_host(host_config(instances, router_given, upgrade, rollout), packages))


def parsed(units: dict) -> dict:
    """`evaluate_host`'s units as tests/nixos_switch.py reads unit files (values as lines, no [Install])."""
    return {name: _parsed({k: v for k, v in u.items() if k != "Install"}) for name, u in units.items()}
