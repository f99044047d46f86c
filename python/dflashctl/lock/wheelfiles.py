"""What a wheel installs, as buildPythonPackage's installer lays it out under $out: every file's
path and content hash, its ELF files (machine, needed libraries) and its console scripts. A scan
is cached beside the wheel, keyed by the wheel's sha256, so a second audit reads no zip."""

import configparser
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dflashctl.lock import elf

SITE = "lib/python3.12/site-packages"
CACHE_TAG = "cpython-312"  # sys.implementation.cache_tag of the stack's Python
SCRIPT_MEMBER = "(entry_points.txt)"  # the member of a console script `installer` writes
SCAN_VERSION = 1


@dataclass(frozen=True)
class Installed:
    path: str  # relative to $out
    member: str  # inside the wheel
    digest: str  # RECORD's hash (sha256=...), or crc32 when RECORD lacks one


@dataclass
class Scan:
    files: list[Installed]
    elf: dict[str, elf.ElfInfo]  # install path -> info, for ELF files only

    def member(self, path: str) -> str | None:
        return next((f.member for f in self.files if f.path == path), None)


def install_path(member: str, site: str = SITE) -> str:
    """`installer`'s scheme: <dist>.data/<scheme>/... to its directory, everything else to
    site-packages. Console scripts come from entry_points.txt (see scan)."""
    top, _, rest = member.partition("/")
    if top.endswith(".data") and rest:
        scheme, _, inner = rest.partition("/")
        dist = top.removesuffix(".data").split("-")[0]
        return {"purelib": f"{site}/{inner}", "platlib": f"{site}/{inner}", "scripts": f"bin/{inner}",
                "headers": f"include/python3.12/{dist}/{inner}", "data": inner}.get(scheme, f"{site}/{member}")
    return f"{site}/{member}"


def _compiled_by_installer(member: str) -> bool:
    """Whether `installer` byte-compiles this member: a .py of the purelib or platlib scheme (the
    wheel's root is one of the two), never scripts, headers or data."""
    top, _, rest = member.partition("/")
    if top.endswith(".data") and rest:
        return rest.partition("/")[0] in ("purelib", "platlib") and member.endswith(".py")
    return member.endswith(".py")


def bytecode(f: Installed) -> list[str]:
    """The byte-code files the install hook writes for installed file `f` (PEP 3147 paths), none for
    anything but a .py of site-packages. pypaInstallHook runs `python -m installer`, which compiles
    at optimization levels 0 and 1 and names the source by its path under the package's own $out:
    the same .py in two packages gives two different .pyc files at one path."""
    if f.member == SCRIPT_MEMBER or not _compiled_by_installer(f.member):
        return []
    folder, _, name = f.path.rpartition("/")
    stem = name.removesuffix(".py")
    return [f"{folder}/__pycache__/{stem}.{CACHE_TAG}{level}.pyc" for level in ("", ".opt-1")]


def _record(z: zipfile.ZipFile) -> dict[str, str]:
    name = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")), None)
    if name is None:
        return {}
    out = {}
    for line in z.read(name).decode().splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1]:
            out[parts[0]] = parts[1]
    return out


def _console_scripts(z: zipfile.ZipFile) -> list[str]:
    name = next((n for n in z.namelist() if n.count("/") == 1
                 and n.endswith(".dist-info/entry_points.txt")), None)
    if name is None:
        return []
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str
    parser.read_string(z.read(name).decode())
    return [f"bin/{script}" for section in ("console_scripts", "gui_scripts")
            if parser.has_section(section) for script in parser.options(section)]


def scan(wheel: Path) -> Scan:
    with zipfile.ZipFile(wheel) as z:
        record = _record(z)
        files, elves = [], {}
        for info in z.infolist():
            if info.is_dir():
                continue
            path = install_path(info.filename)
            digest = record.get(info.filename) or f"crc32={info.CRC:08x}"
            files.append(Installed(path, info.filename, digest))
            if info.file_size < 20:
                continue
            with z.open(info) as f:
                if elf.machine_of(f.read(20)) is None:
                    continue
                try:
                    elves[path] = elf.read(f)
                except elf.NotElf:
                    continue
        for script in _console_scripts(z):
            # Each wheel's script is its own: wrapPythonPrograms writes the package's store path in.
            files.append(Installed(script, SCRIPT_MEMBER, f"script={wheel.name}"))
    return Scan(files, elves)


def cached_scan(wheel: Path, sha256: str) -> Scan:
    """scan(), remembered in <wheel>.scan.json (valid while the sha256 and scanner match)."""
    cache = wheel.with_name(wheel.name + ".scan.json")
    try:
        data = json.loads(cache.read_text())
        if data["sha256"] == sha256 and data["version"] == SCAN_VERSION:
            return Scan([Installed(*f) for f in data["files"]],
                        {p: elf.ElfInfo(e["machine"], e["patched"], tuple(e["needed"]), e["soname"])
                         for p, e in data["elf"].items()})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    result = scan(wheel)
    try:
        cache.write_text(json.dumps({
            "sha256": sha256, "version": SCAN_VERSION,
            "files": [[f.path, f.member, f.digest] for f in result.files],
            "elf": {p: asdict(e) for p, e in result.elf.items()}}))
    except OSError:
        pass  # a read-only wheel directory: scan again next time
    return result

