"""Fake host trees for driver discovery: the NVIDIA driver laid out as each kind of host has it.

Files are empty (discovery reads names, links and versions, never ELF contents); links are made
the way the driver's installer and ldconfig make them (libcuda.so -> libcuda.so.1 -> the versioned
file). `ld_so_cache` writes the current glibc cache format, which ldconfig itself cannot write for
empty files.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dflashctl.host import ld_cache

V580 = "580.159.04"
V570 = "570.86.10"
X86_64 = 0x0303  # FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
I386 = 0x0003  # FLAG_ELF_LIBC6 alone: a 32-bit library

# (stem, soname) of the driver libraries CUDA uses; each is installed as stem.so.<version>.
DRIVER = [("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1"),
          ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
          ("libnvidia-nvvm", "libnvidia-nvvm.so.4"), ("libcudadebugger", "libcudadebugger.so.1"),
          ("libnvidia-gpucomp", None)]
SYSTEM = ["libc.so.6", "libstdc++.so.6", "libGL.so.1", "libz.so.1"]  # must never be linked


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def install_driver(root: Path, directory: str, version: str, dev_links: bool = True) -> None:
    """The files a driver installer puts in `directory`: versioned libraries, soname links and
    (dev_links) the unversioned libcuda.so / libnvidia-ml.so links."""
    d = root / directory.lstrip("/")
    for stem, soname in DRIVER:
        touch(d / f"{stem}.so.{version}")
        if soname:
            link(d / soname, f"{stem}.so.{version}")
        if dev_links and stem in ("libcuda", "libnvidia-ml"):
            link(d / f"{stem}.so", soname)


def install_system_libs(root: Path, directory: str) -> None:
    for name in SYSTEM:
        touch(root / directory.lstrip("/") / name)


def kernel_module(root: Path, version: str, open_module: bool = False) -> None:
    kind = "Open Kernel Module for x86_64" if open_module else "x86_64 Kernel Module"
    text = (f"NVRM version: NVIDIA UNIX {kind}  {version}  Release Build  (dvs-builder@U16)  "
            "Thu Oct  9 10:11:12 UTC 2026\nGCC version:  gcc version 13.3.0\n")
    p = touch(root / "proc/driver/nvidia/version")
    p.write_text(text)


def ld_so_cache(root: Path, entries: list[tuple[str, str, int]]) -> None:
    """/etc/ld.so.cache in the current glibc format from (soname, path, flags)."""
    table, head = bytearray(), ld_cache.NEW_HEADER.size + len(entries) * ld_cache.NEW_ENTRY.size
    packed = bytearray()
    for soname, path, flags in entries:
        key = head + len(table)
        table += soname.encode() + b"\0"
        value = head + len(table)
        table += path.encode() + b"\0"
        packed += ld_cache.NEW_ENTRY.pack(flags, key, value, 0, 0)
    header = ld_cache.NEW_HEADER.pack(ld_cache.NEW_MAGIC, len(entries), len(table), 2, 0)
    touch(root / "etc/ld.so.cache").write_bytes(bytes(header + packed + table))


def links_of(directory: Path, root: Path) -> dict[str, str]:
    """A link directory's contents: name -> target, targets shown relative to the fake root."""
    out = {}
    for entry in sorted(os.listdir(directory)):
        target = os.readlink(directory / entry)
        out[entry] = "/" + os.path.relpath(target, root)
    return out


def expected(directory: str, version: str, sonames: bool = True, dev: bool = True) -> dict[str, str]:
    """What the link directory must hold for a driver installed by install_driver."""
    out = {}
    for stem, soname in DRIVER:
        real = f"{directory}/{stem}.so.{version}"
        out[f"{stem}.so.{version}"] = real
        if soname and sonames:
            out[soname] = real
        if dev and stem in ("libcuda", "libnvidia-ml"):
            out[f"{stem}.so"] = real
    return out



# An NVML with just what dflashctl's driver probe and pynvml's nvmlInit call: a real shared object,
# so tests load it the way the loader loads the driver's.
FAKE_NVML = r"""
#include <string.h>
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned flags) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int rc) { return "fake"; }
int nvmlSystemGetDriverVersion(char *buf, unsigned n) { strncpy(buf, "580.159.04", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 0; return 0; }
"""


def fake_nvml(path: Path, work: Path) -> Path:
    """Compile FAKE_NVML to `path` (soname libnvidia-ml.so.1); skips without a C compiler."""
    cc = shutil.which("cc") or pytest.skip("no C compiler")
    path.parent.mkdir(parents=True, exist_ok=True)
    (work / "nvml.c").write_text(FAKE_NVML)
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(path),
                    str(work / "nvml.c")], check=True)
    return path
