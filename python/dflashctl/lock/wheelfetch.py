"""Reading locked wheels from the package index: a wheel's METADATA (PEP 658 file, else only the
zip members it needs, through HTTP range requests) and whole wheels into a verified cache."""

import hashlib
import io
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from dflashctl.errors import DflashError


def _unreachable(name: str, e: Exception) -> DflashError:
    return DflashError(f"could not read {name} from the package index", str(e),
                       "check the connection to the package index and run the command again")


class RangeReader(io.RawIOBase):
    """A remote file that zipfile can open: seek/read become HTTP range requests. Reading the
    few members a caller needs costs the central directory and those members, not the wheel."""

    def __init__(self, url: str, size: int, timeout: float = 60):
        self.url, self.size, self.timeout, self.pos = url, size, timeout, 0
        self.fetched = 0  # bytes transferred, for the caller's report

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=self.timeout) as r:
            data = r.read() if r.status == 206 else r.read()[self.pos:end]
        buffer[:len(data)] = data
        self.pos += len(data)
        self.fetched += len(data)
        return len(data)


def dist_info_member(names: list[str], leaf: str) -> str | None:
    """The `<name>-<version>.dist-info/<leaf>` path among a wheel's members."""
    found = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/" + leaf)]
    return found[0] if found else None


def metadata_text(url: str, size: int | None = None, timeout: float = 60) -> str:
    """A wheel's METADATA: the index's PEP 658 file (a few KiB) when it serves one, else the
    member itself read out of the remote zip."""
    name = url.rsplit("/", 1)[-1]
    try:
        with urllib.request.urlopen(url + ".metadata", timeout=timeout) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise _unreachable(f"the metadata of {name}", e) from None
    except OSError as e:
        raise _unreachable(f"the metadata of {name}", e) from None
    try:
        if size is None:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                        timeout=timeout) as r:
                size = int(r.headers["Content-Length"])
        with zipfile.ZipFile(io.BufferedReader(RangeReader(url, size, timeout), 1 << 16)) as z:
            member = dist_info_member(z.namelist(), "METADATA")
            if member is None:
                raise DflashError(f"{name} has no .dist-info/METADATA", "the wheel is malformed",
                                  "pin another version of the package in nix/stack.toml")
            return z.read(member).decode()
    except (OSError, zipfile.BadZipFile) as e:
        raise _unreachable(f"the metadata of {name}", e) from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, sha256: str, size: int, progress=None, timeout: float = 60) -> bool:
    """Fetch `url` to `dest` unless a file with that sha256 is already there; verify the hash.

    Returns True when it downloaded. `progress(bytes)` is called as data arrives. A partial or
    wrong file never takes `dest`'s name (written to a temp file, renamed once verified)."""
    if dest.exists() and dest.stat().st_size == size and sha256_of(dest) == sha256:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
            for block in iter(lambda: r.read(1 << 20), b""):
                f.write(block)
                h.update(block)
                if progress:
                    progress(len(block))
        if h.hexdigest() != sha256:
            raise DflashError(f"{dest.name} does not match the lock",
                              f"downloaded sha256 {h.hexdigest()}, the lock says {sha256}",
                              "the index served other bytes than were locked; run `dflashctl lock "
                              "--check` and do not build this lock until it passes")
        os.replace(tmp, dest)
        return True
    except (OSError, urllib.error.URLError) as e:
        raise _unreachable(dest.name, e) from None
    finally:
        if tmp.exists():
            tmp.unlink()

