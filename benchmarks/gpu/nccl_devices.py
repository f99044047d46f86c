"""What SGLang's processes open while they run, held to the unit's DeviceAllow (issue 36).

    python benchmarks/gpu/nccl_devices.py --match sglang --seconds 120 --json devices.json &

Every 0.5 s, for each process whose command line contains --match (SGLang's server, its scheduler
and tensor-parallel workers), reads /proc/PID/fd: character devices (their major:minor), files under
/dev/shm, and sockets, resolved through /proc/net/unix, /proc/net/tcp and tcp6 to their family.
At the end (--seconds, or SIGTERM/SIGINT) writes what was seen, each character device resolved
against service-unit.json's DeviceAllow the way systemd resolves it (`char-NAME`: every major
/proc/devices lists under NAME; a path: that node), so a run shows which of the unit's directives
tensor parallelism needs and that the unit allows it. Standard library only (runs on the device).
"""

import argparse
import fnmatch
import json
import os
import signal
import stat
import time
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "python/dflashctl/service/data/service-unit.json"
# DevicePolicy=closed allows these besides DeviceAllow (systemd.resource-control(5))
PSEUDO = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}


def char_groups() -> dict[int, list[str]]:
    """major -> the names /proc/devices lists it under (character devices only)."""
    out, section = {}, None
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line[:-1]
        elif line.strip() and section == "Character devices":
            major, name = line.split(None, 1)
            out.setdefault(int(major), []).append(name)
    return out


def socket_families() -> dict[str, str]:
    """socket inode -> family (unix, with its name where it has one; tcp; tcp6)."""
    out = {}
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 7:
                out[parts[6]] = "unix " + (parts[7] if len(parts) > 7 else "(unnamed)")
    except OSError:
        pass
    for name in ("tcp", "tcp6"):
        try:
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 9:
                    out[parts[9]] = name
        except OSError:
            pass
    return out


def _kind(family: str | None) -> str:
    if family is None:
        return "other (netlink, udp, ...)"
    if family.startswith("unix "):
        name = family[5:]
        return "unix (abstract)" if name.startswith("@") else "unix (unnamed)" if name == "(unnamed)" else "unix (path)"
    return family


def matching_pids(pattern: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and d.name != str(os.getpid()):
            try:
                if pattern in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def sample(pattern: str, seen: dict) -> None:
    families = None
    for pid in matching_pids(pattern):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                families = families if families is not None else socket_families()
                seen["socket_kinds"].add(_kind(families.get(target[8:-1])))
            elif target.startswith("/dev/shm/"):
                seen["shm"].add(target)
            elif target.startswith("/dev/"):
                try:
                    st = os.stat(target)
                except OSError:
                    continue
                if stat.S_ISCHR(st.st_mode):
                    seen["char"][target] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        seen["pids"].add(pid)


def resolve(devices: dict[str, tuple[int, int]], allow: list[str], groups: dict[int, list[str]]) -> dict:
    names = {n: m for m, ns in groups.items() for n in ns}
    out = {}
    for path, (major, minor) in sorted(devices.items()):
        by = "DevicePolicy=closed" if path in PSEUDO else None
        for entry in allow if by is None else ():
            spec, access = (entry.split() + ["rwm"])[:2]
            if not {"r", "w"} <= set(access):
                continue
            if spec.startswith("char-") and any(fnmatch.fnmatchcase(n, spec[5:]) and m == major
                                                for n, m in names.items()):
                by = entry
                break
            if spec == path:
                by = entry
                break
        out[path] = {"major": major, "minor": minor, "group": groups.get(major), "allowed_by": by}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--match", default="sglang", help="substring of the processes' command lines (sglang)")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    seen = {"char": {}, "shm": set(), "socket_kinds": set(), "pids": set()}
    deadline = time.monotonic() + a.seconds
    samples = 0
    while not stop and time.monotonic() < deadline:
        sample(a.match, seen)
        samples += 1
        time.sleep(0.5)
    allow = json.loads(UNIT.read_text())["service"]["DeviceAllow"]
    devices = resolve(seen["char"], allow, char_groups())
    result = {"samples": samples, "processes": len(seen["pids"]), "char_devices": devices,
              "denied": [p for p, d in devices.items() if d["allowed_by"] is None],
              "dev_shm_files": sorted(seen["shm"]), "socket_families": sorted(seen["socket_kinds"]),
              "unit_device_allow": allow}
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"nccl_devices: {len(seen['pids'])} processes, {len(devices)} character devices "
          f"({len(result['denied'])} outside DeviceAllow: {result['denied']}), {len(seen['shm'])} /dev/shm files, "
          f"sockets: {', '.join(result['socket_families']) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
