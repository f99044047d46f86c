"""The host's /etc/ld.so.cache read as a file: which directory holds which shared library.

A Nix-built Python runs Nix's glibc, whose loader never reads the host's cache, so the NVIDIA
driver a Debian host registered there stays invisible to it. Reading the cache ourselves tells
driver discovery where the host keeps libcuda.so.1. Both layouts glibc writes are read:
the current one (magic `glibc-ld.so.cache` + `1.1`, glibc >= 2.32 writes only it) and the old
one (`ld.so-1.7.0`), alone or followed by the new one. Standard library only.
"""

import struct
from dataclasses import dataclass

NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0"
# struct cache_file_new: magic+version[20], nlibs, len_strings, flags(u8)+pad[3],
# extension_offset, unused[3]; then entries of (flags i32, key u32, value u32, osversion u32, hwcap u64).
NEW_HEADER = struct.Struct("<20sIIB3xI12x")
NEW_ENTRY = struct.Struct("<iIIIQ")
# struct cache_file: magic[11] (+1 pad), nlibs; entries of (flags i32, key u32, value u32).
OLD_HEADER = struct.Struct("<11sxI")
OLD_ENTRY = struct.Struct("<iII")

# The entry flags glibc stores: the low byte is the kind (3 = ELF for glibc), the next the ABI.
FLAG_ELF_LIBC6 = 0x0003
FLAG_TYPE_MASK = 0x00FF
FLAG_REQUIRED_MASK = 0xFF00
ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}  # FLAG_X8664_LIB64, FLAG_AARCH64_LIB64


@dataclass(frozen=True)
class Entry:
    soname: str
    path: str
    flags: int

    def matches(self, machine: str) -> bool:
        """An ELF library of this machine's ABI (not the i386 or x32 copy of the same name)."""
        want = ARCH_FLAGS.get(machine)
        return (self.flags & FLAG_TYPE_MASK) == FLAG_ELF_LIBC6 and \
            (want is None or (self.flags & FLAG_REQUIRED_MASK) == want)


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise ValueError(f"string offset {offset} is outside the cache")
    return data[offset:end].decode("utf-8", "surrogateescape")


def _new_entries(data: bytes, base: int) -> list[Entry]:
    magic, nlibs, _len_strings, _flags, _ext = NEW_HEADER.unpack_from(data, base)
    first = base + NEW_HEADER.size
    if first + nlibs * NEW_ENTRY.size > len(data):
        raise ValueError(f"{nlibs} entries do not fit in {len(data)} bytes")
    out = []
    for i in range(nlibs):
        flags, key, value, _os, _hwcap = NEW_ENTRY.unpack_from(data, first + i * NEW_ENTRY.size)
        out.append(Entry(_string(data, base + key), _string(data, base + value), flags))
    return out


def parse(data: bytes) -> list[Entry]:
    """Every entry of an ld.so.cache, in the cache's order (the loader's preference order).
    Raises ValueError when `data` is not a cache."""
    if data.startswith(NEW_MAGIC):
        return _new_entries(data, 0)
    if not data.startswith(OLD_MAGIC):
        raise ValueError("not an ld.so.cache (unknown magic)")
    _magic, nlibs = OLD_HEADER.unpack_from(data, 0)
    strings = OLD_HEADER.size + nlibs * OLD_ENTRY.size
    if strings > len(data):
        raise ValueError(f"{nlibs} entries do not fit in {len(data)} bytes")
    # glibc appends the new format after the old entries, aligned to 8; prefer it when there.
    new = (strings + 7) & ~7
    if data[new:new + len(NEW_MAGIC)] == NEW_MAGIC:
        return _new_entries(data, new)
    out = []
    for i in range(nlibs):
        flags, key, value = OLD_ENTRY.unpack_from(data, OLD_HEADER.size + i * OLD_ENTRY.size)
        out.append(Entry(_string(data, strings + key), _string(data, strings + value), flags))
    return out

