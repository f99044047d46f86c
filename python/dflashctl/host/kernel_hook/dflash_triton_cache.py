"""Triton's kernel cache with a read-only layer built ahead; Triton imports this module itself.

dflashctl names this class in TRITON_CACHE_MANAGER (`dflash_triton_cache:PrebuiltFirst`) when
$DFLASH_PREBUILT_KERNELS holds a `triton/` directory or $DFLASH_TRITON_RECORD is set. Triton 3.6
asks its cache manager, per cache key, for a kernel's group file (`__grp__<name>.json`, which lists
the kernel's files) and for compiled helper modules (cuda_utils, one launcher per signature). Here
both are looked up in `<prebuilt>/triton/<key>/` first; the group's file names are resolved in that
directory (the paths Triton wrote at build time may have been moved since), and an entry missing
any of its files is a miss. Everything else, and everything written, goes to Triton's own writable
cache (TRITON_CACHE_DIR), as with Triton's default manager. Nothing here compiles or guesses a key:
a prebuilt kernel is used only when Triton itself computes the key it was built under.

With $DFLASH_TRITON_RECORD=FILE every kernel a process asks Triton for (compiled or found) is
appended to FILE as one JSON line (`record`, Triton's compilation listener): the function, its specialisation and options, the target and the
cache key, which is what `dflashctl kernels build --triton-record FILE` compiles without a GPU.
"""

import fcntl
import functools
import json
import os

from triton import knobs
from triton.runtime.cache import FileCacheManager

from dflash_kernel_hook import PREBUILT_ENV, TRITON_RECORD_ENV as RECORD_ENV, TRITON_RECORD_FORMAT as RECORD_FORMAT
from dflash_kernel_hook import TRITON_SUBDIR as SUBDIR


class PrebuiltFirst(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        root = os.environ.get(PREBUILT_ENV)
        self.prebuilt = os.path.join(root, SUBDIR, key) if root and not (override or dump) else None
        if override or dump:
            super().__init__(key, override=override, dump=dump)
        else:
            # Triton's default creates <cache>/<key> for every key it asks about; a prebuilt hit
            # writes nothing, and put() creates the directory when it writes.
            base = knobs.cache.dir
            if not base:
                raise RuntimeError("Triton has no cache directory: set TRITON_CACHE_DIR")
            self.key, self.cache_dir = key, os.path.join(base, key)
            self.lock_path = os.path.join(self.cache_dir, "lock")

    def get_file(self, filename):
        if self.prebuilt:
            path = os.path.join(self.prebuilt, filename)
            if os.path.isfile(path):
                return path
        return super().get_file(filename) if os.path.isdir(self.cache_dir) else None

    def get_group(self, filename):
        if self.prebuilt:
            group = prebuilt_group(self.prebuilt, filename)
            if group is not None:
                return group
        return super().get_group(filename) if os.path.isdir(self.cache_dir) else None


def prebuilt_group(directory: str, filename: str) -> dict | None:
    """A kernel's files in `directory` by the names its group file lists; None unless all are there."""
    try:
        with open(os.path.join(directory, f"__grp__{filename}")) as f:
            children = json.load(f).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(children, dict) or filename not in children:
        return None
    found = {name: os.path.join(directory, os.path.basename(path)) for name, path in children.items()}
    return found if all(os.path.isfile(p) for p in found.values()) else None


# --- recording --------------------------------------------------------------------------------------

def record(src, metadata, metadata_group=None, times=None, cache_hit=None) -> None:
    """Triton's compilation listener while recording (dflash_kernel_hook.record_triton sets it)."""
    try:
        line = record_line(src, metadata)
        if line is not None:
            append(os.environ[RECORD_ENV], line)
    except Exception as e:  # a record is never worth a failed kernel
        print(f"[dflash kernels] triton record skipped ({type(e).__name__}: {e})", flush=True)


def encode_value(value):
    """A constexpr argument as JSON, or raise TypeError for one the build could not rebuild."""
    kind = type(value).__name__
    if kind == "dtype":
        return {"dtype": str(value)}
    if kind == "constexpr":
        return {"constexpr": encode_value(value.value)}
    if kind == "JITFunction":
        return {"jit": [value.module, value.fn.__qualname__]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return {"tuple": [encode_value(v) for v in value]}
    raise TypeError(f"a constexpr of type {kind}")


def record_line(src, metadata) -> dict | None:
    fn = getattr(src, "fn", None)
    if type(fn).__name__ != "JITFunction" or not hasattr(src, "signature"):
        return None  # IR sources and Gluon kernels are not built ahead
    target = metadata.get("target")
    target = target if isinstance(target, dict) else {k: getattr(target, k) for k in ("backend", "arch", "warp_size")}
    names = _option_names(target["backend"], target["arch"], target["warp_size"])
    options = {k: v for k, v in metadata.items() if k in names}
    libs = dict(options.pop("extern_libs", None) or ())
    if set(libs) - {"libdevice"}:
        return None  # a kernel linking more than libdevice names files of this host
    return {
        "format": RECORD_FORMAT, "module": fn.module, "qualname": fn.fn.__qualname__,
        "fn_key": fn.cache_key, "hash": metadata["hash"], "target": target,
        "signature": [[k, v] for k, v in src.signature.items()],  # in the kernel's argument order
        "constants": [[list(k), encode_value(v)] for k, v in src.constants.items()],
        "attrs": [[list(k), v] for k, v in src.attrs.items()],
        "options": options,
    }


@functools.lru_cache(maxsize=None)
def _option_names(backend: str, arch: int, warp_size: int) -> frozenset:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    return frozenset(make_backend(GPUTarget(backend, arch, warp_size)).parse_options({}).__dict__)


def append(path: str, line: dict) -> None:
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # several SGLang processes record into one file
        os.write(fd, data)
    finally:
        os.close(fd)
