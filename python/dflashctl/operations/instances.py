"""The host's instances, found and read one way for `dflashctl status`, `monitoring` and `rollout`.

`--instance FILE` (repeat) names them: one instance's settings each, or the NixOS module's
`{"instances": {...}}`. Without it, every `/etc/dflash/*.json` (where `dflashctl unit` installs
an instance's settings) and `/etc/dflash-instances.json` (where the NixOS module links all of
them): the three commands see the same instances on every host, with or without NixOS.
Each file is checked as `dflashctl validate` checks it; an instance named twice is refused.
"""

import glob
from pathlib import Path

from dflashctl.errors import CONFIG, DflashError
from dflashctl.service import config, validate
from dflashctl.service.config import InstanceConfig

SETTINGS_GLOB = "/etc/dflash/*.json"  # `dflashctl unit`'s settings, one instance each
MODULE_SETTINGS = "/etc/dflash-instances.json"  # the NixOS module's, every instance
DEFAULT_TEXT = f"every {SETTINGS_GLOB} and {MODULE_SETTINGS}"


def files(given: list[str]) -> list[str]:
    """The settings files: those given, else the host's own."""
    if given:
        return list(given)
    found = sorted(glob.glob(SETTINGS_GLOB))
    if Path(MODULE_SETTINGS).exists():
        found.append(MODULE_SETTINGS)
    if not found:
        raise DflashError("no instances on this host", f"no --instance given, no {SETTINGS_GLOB} and no "
                          f"{MODULE_SETTINGS}", "pass each instance's settings with --instance FILE (or the "
                          "module's dflash-instances.json)", CONFIG)
    return found


def load(given: list[str]) -> list[InstanceConfig]:
    """Every instance of those files, each valid, each name once."""
    cfgs: list[InstanceConfig] = []
    for f in files(given):
        errors, _, found = validate.check(config.read_json(f))
        if errors:
            raise DflashError(f"{f} is invalid", f"{len(errors)} problem(s)\n  - " + "\n  - ".join(errors),
                              f"fix it first (`dflashctl validate {f}`)", CONFIG)
        cfgs += found
    names = [c.name for c in cfgs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DflashError("an instance is given twice", ", ".join(twice), "give each settings file once", CONFIG)
    return cfgs
