"""Which wheel a system installs: marker environments and tag priority, as pip decides them."""

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from dflashctl.systems import SYSTEMS


def marker_env(system: str, python: str) -> dict[str, str]:
    """PEP 508 marker variables of CPython `python` on `system` (a Nix system name)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": SYSTEMS[system],
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        # The lowest patch release: a marker that needs a newer one must not pass silently.
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",  # extras are followed explicitly through uv.lock's optional-dependencies
    }


def platforms(system: str, manylinux: tuple[int, int]) -> list[str]:
    """Platform tags, best first: manylinux_<floor> down to _2_17 and the legacy aliases."""
    arch = SYSTEMS[system]
    major, newest = manylinux
    tags = [f"manylinux_{major}_{minor}_{arch}" for minor in range(newest, 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch == "x86_64":  # older aliases exist only for x86 (pip accepts them the same way)
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags


def tag_priority(system: str, python: str, manylinux: tuple[int, int]) -> dict[Tag, int]:
    """Every tag CPython `python` accepts on `system`, mapped to its rank (0 = most preferred)."""
    version = tuple(int(p) for p in python.split("."))
    plats = platforms(system, manylinux)
    cp = f"cp{version[0]}{version[1]}"
    tags = list(cpython_tags(version, abis=[cp, "abi3", "none"], platforms=plats))
    tags += compatible_tags(version, interpreter=cp, platforms=plats)
    return {tag: rank for rank, tag in reversed(list(enumerate(tags)))}


def best_wheel(files: list[str], priority: dict[Tag, int]) -> str | None:
    """The file among `files` pip would pick under `priority`, or None when none fits."""
    best, best_rank = None, None
    for f in files:
        try:
            _, _, _, tags = parse_wheel_filename(f)
        except InvalidWheelFilename:
            continue
        ranks = [priority[t] for t in tags if t in priority]
        if ranks and (best_rank is None or min(ranks) < best_rank):
            best, best_rank = f, min(ranks)
    return best
