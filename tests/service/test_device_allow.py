"""The unit's DeviceAllow, resolved as systemd resolves it, against recorded NVIDIA device layouts.

systemd.resource-control(5): `char-NAME` allows every minor of each major that /proc/devices lists
under NAME in its "Character devices" section (a name may be a glob); a path allows the device
node at that path, if it exists when the unit starts. Layouts: tests/data/devices/<layout>/.
"""

import json
import re

import pytest

from device_layouts import LAYOUTS, UNIT, layout, resolve

# What CUDA (a context on each GPU), UVM (managed memory, every allocation path of torch) and
# NCCL (the driver's capability nodes for IMEX / fabric handles) open.
NEEDED = [r"/dev/nvidia\d+", r"/dev/nvidiactl", r"/dev/nvidia-uvm", r"/dev/nvidia-uvm-tools",
          r"/dev/nvidia-caps/nvidia-cap\d+"]


def device_allow() -> list[str]:
    return json.loads(UNIT.read_text())["service"]["DeviceAllow"]


@pytest.mark.parametrize("name", sorted(p.name for p in LAYOUTS.iterdir() if p.is_dir()))
def test_every_node_cuda_uvm_and_nccl_open_is_allowed(name):
    groups, devs = layout(name)
    majors, single = resolve(device_allow(), groups, devs)
    needed = {p: mm for p, mm in devs.items() if any(re.fullmatch(r, p) for r in NEEDED)}
    assert any(re.fullmatch(NEEDED[0], p) for p in needed), f"{name}: no GPU node recorded"
    denied = sorted(p for p, (major, minor) in needed.items() if major not in majors and (major, minor) not in single)
    assert not denied, f"{name}: DevicePolicy=closed would deny {denied}"


# The NVIDIA driver's character-device groups in /proc/devices (names since driver 550, and the
# older nvidia-frontend): the most a GPU unit may reach. Written out, not matched by a prefix.
NVIDIA_GROUPS = {"nvidia", "nvidiactl", "nvidia-frontend", "nvidia-uvm", "nvidia-caps", "nvidia-caps-imex-channels",
                 "nvidia-nvswitch", "nvidia-nvlink"}


def excess(entries: list[str], name: str) -> list[str]:
    """What `entries` allow beyond the NVIDIA driver's devices on layout `name`: block devices,
    paths outside /dev/nvidia* and /dev/nvidia-caps/, majors of other drivers, access beyond rw."""
    groups, devs = layout(name)
    nvidia = {m for g in NVIDIA_GROUPS for m in groups.get(g, ())}
    out = []
    for entry in entries:
        spec, access = (entry.split() + ["rwm"])[:2]
        if access != "rw":
            out.append(f"{entry}: access {access!r}, not rw (no mknod)")
        if spec.startswith("block-") or spec.startswith("/dev/block/"):
            out.append(f"{entry}: a block device")
        elif spec.startswith("char-"):
            majors, _ = resolve([f"{spec} rw"], groups, devs)
            out += [f"{entry}: major {m} is not the NVIDIA driver's" for m in sorted(majors - nvidia)]
        elif not re.fullmatch(r"/dev/nvidia[\w-]*|/dev/nvidia-caps/nvidia-cap\d+", spec):
            out.append(f"{entry}: not an NVIDIA device node")
        elif spec in devs and devs[spec][0] not in nvidia:
            out.append(f"{entry}: major {devs[spec][0]} is not the NVIDIA driver's")
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in LAYOUTS.iterdir() if p.is_dir()))
def test_only_nvidia_devices_are_allowed(name):
    assert excess(device_allow(), name) == []


def test_on_the_h200_exactly_the_nvidia_majors_and_three_nodes_are_allowed():
    """Resolved against the H200's recorded /proc/devices: every minor of 195 (GPUs and nvidiactl),
    238 (UVM), 239-240 (NVSwitch, NVLink), 241 (capabilities) and 242 (IMEX channels); the three
    nodes also listed by path. Nothing of the other 30 character majors."""
    majors, single = resolve(device_allow(), *layout("h200-580"))
    assert majors == {195, 238, 239, 240, 241, 242}
    assert single == {(195, 255), (238, 0), (238, 1)}


@pytest.mark.parametrize("entry", ["char-mem rw", "block-loop rw", "/dev/sda rw", "char-* rw", "char-nvidia rwm",
                                   "/dev/dri/card0 rw", "char-infiniband_verbs rw"])
def test_an_entry_beyond_the_nvidia_devices_is_found(entry):
    assert excess([*device_allow(), entry], "h200-580") != []


def test_the_parsers_read_the_recorded_files():
    groups, devs = layout("h200-580")
    assert groups["nvidia"] == groups["nvidiactl"] == {195} and "nvidia-frontend" not in groups
    assert devs["/dev/nvidia0"] == (195, 0) and devs["/dev/nvidiactl"] == (195, 255)
    assert devs["/dev/nvidia-caps/nvidia-cap2"] == (241, 2)
    assert groups["nvidia-uvm"] == {238} and devs["/dev/nvidia-uvm-tools"] == (238, 1)
    old_groups, _ = layout("pre550-535")
    assert old_groups["nvidia-frontend"] == {195} and "nvidia" not in old_groups


def test_the_driver_550_rename_is_what_the_old_entries_missed():
    """With only the pre-550 name, the H200's GPU node is denied: the bug this file guards."""
    groups, devs = layout("h200-580")
    old = ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw",
           "char-nvidia-caps rw"]
    majors, single = resolve(old, groups, devs)
    assert 195 not in majors and (195, 0) not in single
