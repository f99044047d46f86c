"""Recorded NVIDIA device layouts (tests/data/devices/<layout>/: /proc/devices and `ls -l` of the
nodes) and the unit's DeviceAllow resolved against them the way systemd resolves it (`resolve`)."""

import fnmatch
import re

from conftest import REPO

LAYOUTS = REPO / "tests/data/devices"
UNIT = REPO / "python/dflashctl/service/data/service-unit.json"


def char_groups(text: str) -> dict[str, set[int]]:
    """/proc/devices' character section: group name -> majors."""
    groups: dict[str, set[int]] = {}
    section = None
    for line in text.splitlines():
        if line.endswith(":"):
            section = line[:-1]
        elif line.strip() and section == "Character devices":
            major, name = line.split(None, 1)
            groups.setdefault(name, set()).add(int(major))
    return groups


def nodes(text: str) -> dict[str, tuple[int, int]]:
    """`ls -l` lines of character devices: path -> (major, minor); a `DIR:` header prefixes the
    names listed under it."""
    out, directory = {}, ""
    for line in text.splitlines():
        if line.endswith(":") and line.startswith("/"):
            directory = line[:-1] + "/"
            continue
        m = re.match(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+\w+\s+\d+\s+[\d:]+\s+(\S+)$", line)
        if m:
            path = m.group(3) if m.group(3).startswith("/") else directory + m.group(3)
            out[path] = (int(m.group(1)), int(m.group(2)))
    return out


def resolve(device_allow: list[str], groups: dict[str, set[int]], devs: dict[str, tuple[int, int]]):
    """(allowed majors with every minor, allowed single nodes), for entries granting r and w."""
    majors, single = set(), set()
    for entry in device_allow:
        spec, access = (entry.split() + ["rwm"])[:2]
        if not {"r", "w"} <= set(access):
            continue
        if spec.startswith("char-"):
            for name, m in groups.items():
                if fnmatch.fnmatchcase(name, spec[len("char-"):]):
                    majors |= m
        elif spec in devs:
            single.add(devs[spec])
    return majors, single


def layout(name: str):
    d = LAYOUTS / name
    return char_groups((d / "proc-devices.txt").read_text()), nodes((d / "dev-nvidia.txt").read_text())
