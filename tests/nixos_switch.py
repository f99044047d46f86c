"""What `nixos-rebuild switch` does to a unit that runs in the old system and exists in the new one.

The rule, as nixpkgs' switch-to-configuration (switch-to-configuration-ng: `parse_unit`,
`compare_units`, `handle_modified_unit`) applies it, read from its source:

- Each unit file is parsed into sections of key -> values; its NAME.d/*.conf drop-ins are merged in;
  [Install] is skipped.
- Equal: nothing. Otherwise the unit is restarted, unless every difference is in [Unit] and is one
  of the keys NixOS ignores there (Description, Documentation, OnFailure, OnSuccess,
  OnFailureJobMode, IgnoreOnIsolate, StopWhenUnneeded, RefuseManualStart, RefuseManualStop,
  AllowIsolate, CollectMode, SourcePath) or X-Reload-Triggers; if X-Reload-Triggers is among them
  the unit is reloaded, else nothing is done. ([Mount] Options alone also reloads.)
- A unit to restart whose [Service] says X-ReloadIfChanged=true is reloaded instead; one with
  X-RestartIfChanged=false (or RefuseManualStop, X-OnlyManualStart) is left alone.
- NixOS writes a service's reloadTriggers and restartTriggers into [Unit] as X-Reload-Triggers and
  X-Restart-Triggers, each the store path of a file holding the triggers (nixos/lib/systemd-lib.nix),
  so each differs exactly when its triggers do; Before=/After=/Wants= are [Unit] keys like any other.

Units here are {section: {key: [values]}}.

For a whole host (`switch`): only units that are active (or activating) are compared; one that is
gone from the new system is stopped; a new one, and an inactive one whose target is started again
(switch-to-configuration restarts the active targets, multi-user.target among them, which starts
the units they want), is started.
"""

IGNORED_IN_UNIT = {"Description", "Documentation", "OnFailure", "OnSuccess", "OnFailureJobMode",
                   "IgnoreOnIsolate", "StopWhenUnneeded", "RefuseManualStart", "RefuseManualStop",
                   "AllowIsolate", "CollectMode", "SourcePath"}
RELOAD_KEY = "X-Reload-Triggers"


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections without [Install]; an empty value clears the key, as systemd reads it."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section is None or section == "Install" or "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        values = out.setdefault(section, {}).setdefault(key, [])
        if value:
            values.append(value)
        else:
            values.clear()
    return out


def compare(old: dict, new: dict) -> str:
    """'equal', 'reload' or 'restart' for two parsed units (before X-ReloadIfChanged and friends)."""
    result = "equal"
    old, new = {k: v for k, v in old.items() if k != "Install"}, {k: v for k, v in new.items() if k != "Install"}
    for section in old.keys() | new.keys():
        a, b = old.get(section, {}), new.get(section, {})
        for key in a.keys() | b.keys():
            if a.get(key) == b.get(key):
                continue
            if section == "Unit" and key == RELOAD_KEY:
                result = "reload"
            elif section == "Unit" and key in IGNORED_IN_UNIT:
                continue
            elif section == "Mount" and key == "Options":
                result = "reload"
            else:
                return "restart"
    return result


def _flag(unit: dict, section: str, key: str, default: bool) -> bool:
    values = unit.get(section, {}).get(key)
    return values[-1] in ("1", "yes", "true", "on") if values else default


def action(old: dict, new: dict) -> str:
    """What switch-to-configuration does to the running unit: 'nothing', 'reload' or 'restart'."""
    verdict = compare(old, new)
    if verdict == "equal":
        return "nothing"
    if verdict == "reload":
        return "reload"
    if _flag(new, "Service", "X-ReloadIfChanged", False):
        return "reload"
    if not _flag(new, "Service", "X-RestartIfChanged", True) or _flag(new, "Unit", "RefuseManualStop", False) \
            or _flag(new, "Unit", "X-OnlyManualStart", False):
        return "nothing"
    return "restart"


def switch(old: dict[str, dict], new: dict[str, dict], active: set[str]) -> dict[str, str]:
    """unit -> 'nothing' | 'reload' | 'restart' | 'start' | 'stop' for a host going from `old` to
    `new` (unit name -> parsed unit), `active` the units running before (the rest are inactive;
    every unit here is wanted by multi-user.target)."""
    out = {}
    for name in old.keys() | new.keys():
        if name not in new:
            out[name] = "stop" if name in active else "nothing"
        elif name not in old or name not in active:
            out[name] = "start"
        else:
            out[name] = action(old[name], new[name])
    return out

