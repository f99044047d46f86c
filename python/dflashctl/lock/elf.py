"""Just enough of ELF to predict autoPatchelf: the machine, whether a file is patched at all, and
the libraries it needs (DT_NEEDED). Reads through any seekable file object, so a member of a
wheel is parsed straight from the zip without unpacking it to disk.

What autoPatchelf skips, this reports as not `patched`: object files (no program headers) and
static executables (neither PT_INTERP nor PT_DYNAMIC).
"""

import struct
from dataclasses import dataclass

MAGIC = b"\x7fELF"
MACHINES = {62: "x86_64", 183: "aarch64"}  # e_machine -> platform_machine
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_SONAME = 0, 1, 5, 10, 14


class NotElf(Exception):
    pass


@dataclass(frozen=True)
class ElfInfo:
    machine: str  # "x86_64", "aarch64", or "e_machine=N"
    patched: bool  # autoPatchelf looks at it (dynamic, with program headers)
    needed: tuple[str, ...] = ()
    soname: str | None = None


def machine_of(head: bytes) -> str | None:
    """The machine of an ELF file from its first 20 bytes; None when it is not ELF."""
    if len(head) < 20 or head[:4] != MAGIC or head[5] not in (1, 2):
        return None
    (machine,) = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)
    return MACHINES.get(machine, f"e_machine={machine}")


def _reader(f):
    def at(offset: int, size: int) -> bytes:
        f.seek(offset)
        data = f.read(size)
        if len(data) != size:
            raise NotElf(f"truncated at offset {offset}")
        return data
    return at


def read(f) -> ElfInfo:
    """Parse the ELF file open in `f` (binary, seekable). Raises NotElf for anything else."""
    at = _reader(f)
    ident = at(0, 16)
    if ident[:4] != MAGIC or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise NotElf("no ELF header")
    wide, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
    header = at(16, 48 if wide else 36)
    machine = MACHINES.get(struct.unpack_from(end + "H", header, 2)[0])
    machine = machine or f"e_machine={struct.unpack_from(end + 'H', header, 2)[0]}"
    if wide:
        phoff, = struct.unpack_from(end + "Q", header, 16)
        phentsize, phnum = struct.unpack_from(end + "HH", header, 38)
        ph_fmt, dyn_fmt = end + "IIQQQQQQ", end + "qQ"
    else:
        phoff, = struct.unpack_from(end + "I", header, 12)
        phentsize, phnum = struct.unpack_from(end + "HH", header, 26)
        ph_fmt, dyn_fmt = end + "IIIIIIII", end + "iI"
    if phnum == 0:
        return ElfInfo(machine, False)
    loads, dynamic, interp = _segments(at(phoff, phentsize * phnum), phnum, phentsize, ph_fmt, wide)
    if dynamic is None:
        return ElfInfo(machine, interp)  # static: nothing to resolve
    return _dynamic_info(at, machine, loads, dynamic, dyn_fmt)


def _segments(table: bytes, phnum: int, phentsize: int, ph_fmt: str, wide: bool):
    """The program headers: loaded segments as (vaddr, offset, size), the dynamic segment's
    (offset, size) or None, and whether an interpreter is named."""
    loads, dynamic, interp = [], None, False
    for i in range(phnum):
        fields = struct.unpack_from(ph_fmt, table, i * phentsize)
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == _PT_INTERP:
            interp = True
    return loads, dynamic, interp


def _dynamic_info(at, machine: str, loads: list, dynamic: tuple[int, int], dyn_fmt: str) -> ElfInfo:
    """NEEDED and SONAME from the dynamic segment, their strings found through the loaded segments."""
    entry = struct.calcsize(dyn_fmt)
    raw = at(dynamic[0], dynamic[1] - dynamic[1] % entry)
    tags: dict[int, list[int]] = {}
    for tag, value in struct.iter_unpack(dyn_fmt, raw):
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, []).append(value)
    if _DT_STRTAB not in tags:
        return ElfInfo(machine, True)

    def file_offset(vaddr: int) -> int:
        for start, offset, size in loads:
            if start <= vaddr < start + size:
                return offset + vaddr - start
        raise NotElf(f"address {vaddr:#x} is in no loaded segment")

    strtab = at(file_offset(tags[_DT_STRTAB][0]), tags.get(_DT_STRSZ, [0])[0])

    def string(i: int) -> str:
        return strtab[i:strtab.index(b"\0", i)].decode("utf-8", "replace")

    soname = string(tags[_DT_SONAME][0]) if _DT_SONAME in tags else None
    return ElfInfo(machine, True, tuple(string(i) for i in tags.get(_DT_NEEDED, [])), soname)
