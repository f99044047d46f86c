"""What tensor parallelism needs from the instance's unit: NCCL between the ranks on one host.

SGLang runs one process per GPU of an instance (`gpus = [ 0 1 ]`, tpSize 2), all inside the
instance's unit, and they talk through NCCL: over NVLink or PCIe peer access (CUDA IPC: the
NVIDIA character devices), through shared memory files in /dev/shm (NCCL's SHM transport, its
proxy buffers), Unix sockets (NCCL's proxy and the cuMem file-descriptor exchange), a loopback
TCP bootstrap (torch.distributed's store, NCCL's bootstrap) and netlink (getifaddrs, to list the
interfaces). On NVSwitch hosts the driver adds nvidia-nvswitch, nvidia-nvlink and nvidia-caps
(-imex-channels) nodes. Each need is checked against service-unit.json, the one source of both
units (the NixOS module's and `dflashctl unit`'s), resolved against the device layouts recorded
on the H200 (tests/data/devices) the way systemd resolves DeviceAllow. Which of these a real TP=2
run opens is what benchmarks/gpu/tp2.sh records (benchmarks/gpu/nccl_devices.py).
"""

import json

import pytest
from device_layouts import LAYOUTS, UNIT, layout, resolve

SERVICE = json.loads(UNIT.read_text())["service"]
NCCL_DEVICE_GROUPS = ["nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia-nvswitch", "nvidia-nvlink",
                      "nvidia-caps-imex-channels"]
# directives that would hide /dev/shm, make it read-only, or swap it for an empty one
SHM_HIDERS = ("InaccessiblePaths", "ReadOnlyPaths", "TemporaryFileSystem", "BindReadOnlyPaths")


def test_every_nvidia_group_nccl_may_open_is_allowed_on_the_h200():
    groups, devs = layout("h200-580")
    majors, _ = resolve(SERVICE["DeviceAllow"], groups, devs)
    for name in NCCL_DEVICE_GROUPS:
        assert groups[name] <= majors, f"DeviceAllow lacks char-{name} (major {groups[name]})"
    assert SERVICE["DevicePolicy"] == "closed"  # and nothing else: test_device_allow holds that


@pytest.mark.parametrize("name", sorted(p.name for p in LAYOUTS.iterdir() if p.is_dir()))
def test_nvswitch_and_nvlink_nodes_are_allowed_wherever_the_driver_has_them(name):
    groups, devs = layout(name)
    majors, _ = resolve(SERVICE["DeviceAllow"], groups, devs)
    present = [g for g in ("nvidia-nvswitch", "nvidia-nvlink", "nvidia-caps") if g in groups]
    assert present and all(groups[g] <= majors for g in present)


def test_dev_shm_stays_the_hosts_writable_tmpfs():
    # ProtectSystem=strict makes the file system read-only except /dev, /proc and /sys
    # (systemd.exec(5)); PrivateDevices would give the unit a /dev without the GPUs.
    assert SERVICE["ProtectSystem"] == "strict" and SERVICE["PrivateDevices"] is False
    for key in SHM_HIDERS:
        paths = SERVICE.get(key) or []
        assert not [p for p in ([paths] if isinstance(paths, str) else paths)
                    if "/dev/shm".startswith(p.split(":")[0].lstrip("-+").rstrip("/") or "/")], key
    # NCCL's shm files live only as long as the unit: RemoveIPC cleans them when it stops
    assert SERVICE["RemoveIPC"] is True


def test_the_ranks_reach_each_other_over_unix_sockets_loopback_and_netlink():
    families = set(SERVICE["RestrictAddressFamilies"])
    assert {"AF_UNIX", "AF_INET", "AF_NETLINK"} <= families
    assert SERVICE["PrivateIPC"] is False  # all ranks are in this unit; its IPC namespace is theirs


def test_the_system_calls_nccl_and_numa_binding_make_are_allowed():
    # @system-service holds @ipc (shm, memfd), @memlock and sched_setaffinity; @resources adds
    # mbind/set_mempolicy for NUMA binding of each GPU's rank
    allowed = SERVICE["SystemCallFilter"]
    assert "@system-service" in allowed[0] and "@resources" in allowed[0]
    assert all(not f.startswith("~") or "@ipc" not in f and "@memlock" not in f for f in allowed)
    assert SERVICE["RestrictNamespaces"] is True  # NCCL creates none
