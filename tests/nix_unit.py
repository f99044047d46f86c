"""The NixOS module's units without nixpkgs: nix/lib/service-unit.nix evaluated with plain Nix.

nix/module.nix hands exactly these directives to `systemd.services` (at mkDefault priority); this
helper gives them for a configuration written as a host would write `services.dflash.instances`,
with every option that is not set taken from dflashctl's settings schema (tests/nix/test_unit_nix.py
checks that the module declares the same defaults). For the systemd tier too:

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


def evaluate_many(cases: list[dict]) -> tuple[list[dict], list[str]]:
    """One Nix evaluation for many cases, each {"instances": {name: every option}} (optionally
    "dflashctl", "python"). Returns (a result per case, the library's settings keys)."""
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
