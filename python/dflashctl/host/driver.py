"""Driver discovery: the host's NVIDIA user-space driver, shown to the stack's processes alone.

A Nix-built Python loads libraries with Nix's glibc, which never reads the host's ld.so.cache and
never searches /usr/lib: `ctypes.CDLL("libnvidia-ml.so.1")` (nvidia-ml-py, our NVML probe) and
libcuda.so.1 from torch find nothing unless someone says where the driver is. This module says it,
once, for doctor, serve's preflight, the SGLang child and smoke:

1. find the directory: an explicit setting (`driverLibraryDir`, else $DFLASH_DRIVER_LIBRARY_DIR)
   wins; otherwise the first of NixOS's /run/opengl-driver/lib, the directories the host's own
   /etc/ld.so.cache names for libcuda.so.1 / libnvidia-ml.so.1 (ld_cache.py), and the usual
   places (multiarch dirs, /usr/lib64, a GPU container's /usr/local/nvidia/lib64, WSL) whose
   driver version matches the loaded kernel module (/proc/driver/nvidia/version);
2. link only the driver's libraries (DRIVER_LIBRARY) into a small directory under the cache,
   named by a hash of what it links, and put that directory first on the child's LD_LIBRARY_PATH.
   Never the whole system directory: its glibc and libstdc++ would replace Nix's in the child.

Every path is read under `root`, so tests run the same code over fake host trees.
"""

import hashlib
import os
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl import errors
from dflashctl.host import ld_cache
from dflashctl.host.probes import MIN_DRIVER, Check, fail, ok, warn

ENV = "DFLASH_DRIVER_LIBRARY_DIR"
NIXOS_DIR = "/run/opengl-driver/lib"
USUAL_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
              "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")
LD_CACHE = "/etc/ld.so.cache"
KERNEL_VERSION_FILE = "/proc/driver/nvidia/version"
# What the driver package installs for CUDA, NVML, NVENC/NVDEC and OptiX (WSL adds libdxcore,
# which its libcuda loads); nothing else of the host directory is exposed.
DRIVER_LIBRARY = re.compile(
    r"^(libcuda|libcudadebugger|libnvcuvid|libnvoptix|libdxcore|libnvdxgdmal|libnvidia-[a-z0-9-]+)"
    r"\.so(\.[0-9.]+)?$")
# A directory holds a driver when it has the loader's name of libcuda or NVML (a CUDA toolkit's
# stubs/ directory has only the unversioned libcuda.so, which must not count).
MARKER = re.compile(r"^lib(cuda|nvidia-ml)\.so\.[0-9]")
DRIVER_VERSION = re.compile(r"\.so\.(\d{3,}\.\d+(?:\.\d+)?)$")  # libcuda.so.580.159.04
SONAMES = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1"}


@dataclass(frozen=True)
class Driver:
    directory: str  # the host's directory (as the host names it)
    found_by: str  # driverLibraryDir, $DFLASH_DRIVER_LIBRARY_DIR, NixOS, ld.so.cache, scan
    version: str | None  # from libcuda's / libnvidia-ml's file name; None where unversioned (WSL)
    kernel_version: str | None  # the loaded kernel module's; None when /proc does not say
    links: dict[str, str] = field(default_factory=dict)  # link name -> the real file it points at

    def describe(self) -> str:
        v = f"driver {self.version}" if self.version else "driver libraries"
        return f"{v} in {self.directory} (found by {self.found_by}), {len(self.links)} libraries"


class Host:
    """Paths of the host as seen from `root` (/ on a real host, a fake tree in tests)."""

    def __init__(self, root: str | Path = "/"):
        self.root = Path(root)

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def resolve(self, p: str) -> str | None:
        """`p` with every symlink followed inside root (an absolute link target stays in root);
        None when it leads nowhere."""
        parts, seen = list(Path(p).parts[1:]), 0
        done = "/"
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                done = os.path.dirname(done)
                continue
            cand = os.path.join(done, name)
            try:
                target = os.readlink(self.path(cand))
            except FileNotFoundError:
                return None
            except OSError:  # not a link
                done = cand
                continue
            seen += 1
            if seen > 40:
                return None
            parts = list(Path(target).parts[1:] if target.startswith("/") else Path(target).parts) + parts
            if target.startswith("/"):
                done = "/"
        return done if self.path(done).exists() else None


def kernel_version(host: Host) -> str | None:
    """`NVRM version: NVIDIA UNIX [Open Kernel Module for] x86_64 Kernel Module  580.159.04 ...`"""
    try:
        text = host.path(KERNEL_VERSION_FILE).read_text(errors="replace")
    except OSError:
        return None
    first = text.splitlines()[0] if text else ""
    m = re.search(r"Kernel Module.*?\s(\d{3,}\.\d+(?:\.\d+)?)(\s|$)", first)
    return m.group(1) if m else None


def ld_cache_dirs(host: Host, machine: str) -> list[str]:
    """Directories the host's ld.so.cache gives for libcuda.so.1 / libnvidia-ml.so.1, in its order."""
    try:
        entries = ld_cache.parse(host.path(LD_CACHE).read_bytes())
    except (OSError, ValueError, UnicodeError):
        return []
    dirs = []
    for e in entries:
        if e.soname in SONAMES.values() and e.matches(machine):
            d = os.path.dirname(e.path)
            if d not in dirs:
                dirs.append(d)
    return dirs


def candidates(host: Host, setting: str | None, env: dict, machine: str) -> list[tuple[str, str]]:
    """(directory, how it was found), most trusted first; an explicit setting is the only one."""
    if setting:
        return [(setting, "driverLibraryDir")]
    if env.get(ENV):
        return [(env[ENV], f"${ENV}")]
    out = [(NIXOS_DIR, "NixOS")] + [(d, "ld.so.cache") for d in ld_cache_dirs(host, machine)] \
        + [(d, "scan") for d in USUAL_DIRS]
    seen, unique = set(), []
    for d, how in out:
        real = host.resolve(d)
        if real and real not in seen:
            seen.add(real)
            unique.append((d, how))
    return unique


@dataclass
class Scan:
    """What one directory holds: driver library name -> (real file, its driver version or None)."""
    directory: str
    files: dict[str, tuple[str, str | None]]

    @property
    def versions(self) -> set[str]:
        """The driver versions of its libcuda / libnvidia-ml."""
        return {v for name, (_, v) in self.files.items() if v and name.split(".so")[0] in SONAMES}

    def has_driver(self) -> bool:
        return any(MARKER.match(n) for n in self.files)


def scan(host: Host, directory: str) -> Scan:
    files, real_dir = {}, host.resolve(directory)
    try:
        names = sorted(os.listdir(host.path(real_dir))) if real_dir else []
    except OSError:
        names = []
    for name in names:
        if not DRIVER_LIBRARY.match(name):
            continue
        real = host.resolve(os.path.join(real_dir, name))
        if real is None or not host.path(real).is_file():
            continue
        m = DRIVER_VERSION.search(real)
        files[name] = (real, m.group(1) if m else None)
    return Scan(directory, files)


def select(s: Scan, version: str | None) -> dict[str, str]:
    """The links for one driver version: every library of that version or of none (WSL's,
    libnvidia-egl-wayland's own numbering), plus the loader's names of libcuda and NVML when the
    directory's own symlinks point at another version."""
    links = {n: real for n, (real, v) in s.files.items() if v is None or v == version}
    for stem, soname in SONAMES.items():
        if soname not in links:
            mine = [real for n, (real, v) in s.files.items() if n.startswith(stem + ".so.") and v == version]
            if mine:
                links[soname] = mine[0]
    return links


def discover(root: str | Path = "/", setting: str | None = None, env: dict | None = None,
             machine: str | None = None) -> Driver | None:
    """The host's driver, or None when no directory holds one. Raises DflashError(PREFLIGHT_DRIVER)
    when the only driver libraries found belong to another version than the loaded kernel module,
    or when an explicit directory holds none."""
    host, env = Host(root), os.environ if env is None else env
    machine = machine or platform.machine()
    kernel = kernel_version(host)
    others = []
    for directory, how in candidates(host, setting, env, machine):
        s = scan(host, directory)
        if not s.has_driver():
            continue
        versions = s.versions
        if kernel and versions and kernel not in versions:
            others.append(f"{', '.join(sorted(versions))} in {directory}")
            continue
        version = kernel if kernel in versions else (max(versions) if versions else None)
        links = {n: str(host.path(real)) for n, real in select(s, version).items()}
        return Driver(directory, how, version, kernel, links)
    if others:
        raise errors.DflashError(
            f"the NVIDIA driver libraries do not match the loaded kernel module {kernel}",
            f"found {'; '.join(others)}: CUDA refuses a user-space driver of another version "
            "(a driver upgrade without a reboot leaves exactly this)",
            "reboot so the kernel module matches the installed driver, or install the driver's "
            f"libraries of version {kernel}; set driverLibraryDir (or ${ENV}) to their directory",
            errors.PREFLIGHT_DRIVER)
    if setting or env.get(ENV):
        where = candidates(host, setting, env, machine)[0]
        raise errors.DflashError(
            f"no NVIDIA driver library in {where[0]} ({where[1]})",
            "it holds neither libcuda.so.1 nor libnvidia-ml.so.1",
            "point it at the directory holding the driver's libcuda.so.1, or unset it to search "
            "the usual places", errors.PREFLIGHT_DRIVER)
    return None


def searched() -> str:
    """The places discovery looks, for messages."""
    return ", ".join([NIXOS_DIR, f"the directories {LD_CACHE} names for libcuda.so.1", *USUAL_DIRS])


def link_dir(drv: Driver, cache: Path) -> Path:
    """A directory of symlinks to the driver's libraries only, under `cache`; named by a hash of
    its links and each target's size and mtime (nix-gl-host's cache key), so a driver upgrade
    makes a new one and an unchanged driver reuses the old one."""
    h = hashlib.sha256()
    for name, target in sorted(drv.links.items()):
        st = os.stat(target)
        h.update(f"{name}\0{target}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    out = cache / f"driver-{h.hexdigest()[:16]}"
    if out.is_dir():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".driver-", dir=cache))
    try:
        for name, target in drv.links.items():
            (tmp / name).symlink_to(target)
        os.replace(tmp, out)  # atomic; a concurrent start that won the race made the same links
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.is_dir():
            raise
    return out


def cache_root(env: dict) -> Path:
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "dflashctl"


def provide(env: dict, setting: str | None = None, root: str | Path = "/") -> tuple[dict, Driver | None]:
    """`env` with the driver's link directory first on LD_LIBRARY_PATH (unchanged when no driver
    is found: the loader's own search, and then the NVML probe, decide). Raises like discover()."""
    drv = discover(root, setting, env)
    if drv is None:
        return dict(env), None
    try:
        links = link_dir(drv, cache_root(env))
    except OSError as e:
        raise errors.DflashError(f"cannot link the NVIDIA driver's libraries under {cache_root(env)}",
                                 e.strerror or str(e), "make XDG_CACHE_HOME (or HOME/.cache) writable",
                                 errors.PREFLIGHT_DRIVER) from None
    env = dict(env)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(links)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(
        os.pathsep) if p and p != str(links)])
    return env, drv


def locate(env: dict, setting: str | None = None,
           root: str | Path = "/") -> tuple[dict, Driver | errors.DflashError | None]:
    """provide() for reporting: a discovery failure is returned, not raised (doctor shows it)."""
    try:
        return provide(env, setting, root)
    except errors.DflashError as e:
        return dict(env), e


def check(found: Driver | errors.DflashError | None) -> Check:
    """doctor's and preflight's line for discovery (the NVML `driver` check after it shows whether
    the libraries work)."""
    if isinstance(found, errors.DflashError):
        return fail("driver-libs", f"{found.what}: {found.why}" if found.why else found.what, found.fix,
                    found.exit_code)
    if found is None:
        return warn("driver-libs", f"no NVIDIA driver libraries found in {searched()}",
                    f"install the NVIDIA driver >= {MIN_DRIVER} (it provides libcuda.so.1 and libnvidia-ml.so.1); "
                    f"if it lives elsewhere, set driverLibraryDir (or ${ENV}) to its directory")
    return ok("driver-libs", found.describe(), directory=found.directory, found_by=found.found_by,
              version=found.version, kernel_version=found.kernel_version, links=sorted(found.links))
