"""The NixOS module's units without nixpkgs: nix/lib/service-unit.nix evaluated with plain Nix.

nix/modules/instances.nix hands exactly these entries to `systemd.services` (directives at mkDefault
priority); this helper gives them for a configuration written as a host would write
`services.dflash.instances`, with every option that is not set taken from dflashctl's settings
schema (tests/nix/test_unit_nix.py checks that the module declares the same defaults), and the unit
NixOS writes from each (`written`, `text`). For the systemd tier too:

    from nix_unit import evaluate, unit_text
    text = unit_text({"a": {"model": "m", "gpus": [0]}}, "a")
"""

import json
import subprocess
import tempfile
from pathlib import Path

from dflashctl.service import config
from nixeval import nix_env

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "nix" / "harness" / "service-unit.nix"
MODULE_ONLY = ("user", "group")  # options the settings file does not carry
DFLASHCTL = "/opt/dflash/bin/dflashctl"
PYTHON = "/opt/dflash-env/bin/python"


def full_options(name: str, options: dict) -> dict:
    """Every option's value for one instance, as the module passes it on (a refusal raises)."""
    settings = {k: v for k, v in options.items() if k not in MODULE_ONLY}
    values = config.to_dict(config.from_dict(settings, name))
    del values["name"]
    return {**values, **{k: options.get(k) for k in MODULE_ONLY}}


def nixos_written(entry: dict, global_environment: dict | None = None) -> dict:
    """The unit file NixOS writes from a systemd.services entry as evaluated (every option's final
    value), as {section: {directive: value}}, the rule stated here apart from nix/lib/service-entry.nix:
    systemd.globalEnvironment and the entry's `environment` (a variable of its own wins) as
    Environment="NAME=value" lines, sorted by name, before serviceConfig's own Environment= lines;
    restartIfChanged = false as X-RestartIfChanged=false; the triggers as X-Restart-Triggers and
    X-Reload-Triggers; the lists and description as [Unit] directives."""
    env = {**(global_environment or {}), **entry.get("environment", {})}
    unit = {"Description": entry["description"]}
    for key, option in (("After", "after"), ("Wants", "wants"), ("Before", "before")):
        if entry.get(option):
            unit[key] = entry[option]
    unit.update(entry.get("unitConfig", {}))
    for key, option in (("X-Restart-Triggers", "restartTriggers"), ("X-Reload-Triggers", "reloadTriggers")):
        if entry.get(option):
            unit[key] = entry[option]
    service = {k: v for k, v in entry["serviceConfig"].items() if k != "Environment"}
    lines = [json.dumps(f"{k}={env[k]}") for k in sorted(env)] + entry["serviceConfig"].get("Environment", [])
    if lines:
        service["Environment"] = lines
    if not entry.get("restartIfChanged", True):
        service["X-RestartIfChanged"] = False
    return {"Unit": unit, "Service": service,
            "Install": {"WantedBy": entry["wantedBy"]} if entry.get("wantedBy") else {}}


def without_digest(written: dict) -> tuple[dict, str]:
    """(the unit without its DFLASH_UNIT_DIGEST line, the digest): what the digest covers."""
    env = written["Service"]["Environment"]
    digests = [e.split("=", 1)[1] for e in env if e.startswith("DFLASH_UNIT_DIGEST=")]
    assert len(digests) == 1, env
    service = {**written["Service"], "Environment": [e for e in env if not e.startswith("DFLASH_UNIT_DIGEST=")]}
    return {**written, "Service": service}, digests[0]


def evaluate_many(cases: list[dict]) -> tuple[list[dict], list[str]]:
    """One Nix evaluation for many cases, each {"instances": {name: every option}} (optionally
    "dflashctl", "python", "settingsFiles", "path", "nixos": tests/nix/harness/service-unit.nix).
    Returns (a result per case, the library's settings keys)."""
    cases = [{"dflashctl": DFLASHCTL, "python": PYTHON, **c} for c in cases]
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="dflash-cases-") as f:
        json.dump(cases, f)
        f.flush()
        r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", str(DRIVER),
                            "--argstr", "casesFile", f.name], capture_output=True, text=True,
                           env=nix_env(), timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"nix-instantiate {DRIVER} failed:\n{r.stderr}")
    out = json.loads(r.stdout)
    return out["results"], out["settingsKeys"]


def evaluate(instances: dict) -> dict:
    """The result for one configuration written as a host writes it (unset options defaulted)."""
    full = {name: full_options(name, options) for name, options in instances.items()}
    return evaluate_many([{"instances": full}])[0][0]


def unit_text(instances: dict, name: str) -> str:
    """The unit file of instance `name` (dflash-<name>.service) from the module's directives."""
    result = evaluate(instances)
    if result["failedAssertions"]:
        raise AssertionError("\n".join(result["failedAssertions"]))
    return result["units"][name]["text"]
