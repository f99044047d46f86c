"""Prebuilt SGLang JIT kernels, loaded inside SGLang's own processes (standard library only).

SGLang 0.5.11 builds each JIT kernel with `tvm_ffi.cpp.load_inline`: tvm-ffi hashes the module's
inputs into a build directory `<name>_<key>` under TVM_FFI_CACHE_DIR, takes a lock file there,
runs ninja and loads `<name>.so`. A directory built ahead cannot serve as that cache: build.ninja
holds absolute paths (a copy elsewhere rebuilds everything) and a read-only one blocks forever on
the lock. So this module wraps `load_inline`: it computes the same key, and when
$DFLASH_PREBUILT_KERNELS holds `<name>_<key>/<name>.so` whose recorded inputs still match, loads
that file directly (no ninja, no lock, nothing written). Anything else falls through to tvm-ffi's
own JIT into the writable TVM_FFI_CACHE_DIR, which is checked first so a read-only cache fails at
once with the fix instead of hanging.

The key is our own reimplementation of tvm-ffi 0.1.11's (read in its extension.py, not copied):
sha256 over a tagged encoding of the decorated sources, the exported functions and the flags,
first 16 hex digits. It covers SGLang's sources by their absolute paths only, so a patched or
rebuilt SGLang at the same path would keep the key: each prebuilt module also records a digest
of the headers it can include (SGLang's jit_kernel tree, tvm-ffi's headers) and the CUDA arch list
it was built for, and a difference is a miss.

With $DFLASH_KERNELS_RECORD=DIR instead (`dflashctl kernels build`), every module tvm-ffi builds
is copied into DIR under its key, with those records.
"""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import threading

PREBUILT_ENV = "DFLASH_PREBUILT_KERNELS"
RECORD_ENV = "DFLASH_KERNELS_RECORD"
# Triton's layer (dflash_triton_cache.py, which needs Triton and so lives apart): its directory in
# the prebuilt one, the variable that records Triton's kernels, the record's format.
TRITON_SUBDIR = "triton"
TRITON_RECORD_ENV = "DFLASH_TRITON_RECORD"
TRITON_RECORD_FORMAT = 1
RECORD = "dflash-prebuilt.json"  # beside each prebuilt <name>.so
FORMAT = 1
ARCH_ENV = "TVM_FFI_CUDA_ARCH_LIST"  # SGLang sets it around each build from the GPU (or the override)

# What tvm-ffi puts in front of every inline source before hashing and compiling it.
_PREAMBLE = ["container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h"]
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ABS_INCLUDE = re.compile(r'^\s*#\s*include\s+"(/[^"]+)"', re.M)


# --- the key --------------------------------------------------------------------------------------

def _encode(value, out: list) -> None:
    """The tagged byte stream tvm-ffi hashes: a type tag, then the value (maps by sorted key)."""
    if value is None:
        out.append(b"None")
    elif isinstance(value, str):
        out += [b"str", value.encode()]
    elif isinstance(value, bytes):
        out += [b"bytes", value]
    elif isinstance(value, dict):
        out.append(b"Mapping")
        for k in sorted(value):
            _encode(k, out)
            _encode(value[k], out)
    elif isinstance(value, (list, tuple)):
        out.append(b"Sequence")
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"cannot key a {type(value).__name__}")


def digest(cpp_source, cuda_source, cpp_files, cuda_files, functions, cflags, cuda_cflags, ldflags,
           include_paths, embed_cubin=None) -> str:
    """tvm-ffi's cache key of these inputs (its `_hash_sources`, same argument order)."""
    chunks: list = []
    _encode((cpp_source, cuda_source,
             None if cpp_files is None else sorted(cpp_files),
             None if cuda_files is None else sorted(cuda_files),
             functions, cflags, cuda_cflags, ldflags, include_paths, embed_cubin), chunks)
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()[:16]


def _decorated(source: str, functions: dict) -> str:
    lines = [f"#include <tvm/ffi/{h}>" for h in _PREAMBLE] + ["", source]
    for fn, doc in functions.items():
        lines.append(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({fn}, {fn});")
        if doc:
            escaped = "".join(_ESCAPES.get(ch, ch) for ch in doc)
            lines.append(f'TVM_FFI_DLL_EXPORT_TYPED_FUNC_DOC({fn}, "{escaped}");')
    return "\n".join(lines + [""])


def _as_list(x) -> list:
    return [] if x is None else [x] if isinstance(x, str) else list(x)


def inline_dir_name(name: str, cpp_sources=None, cuda_sources=None, functions=None, extra_cflags=None,
                    extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                    embed_cubin=None, **_ignored) -> str:
    """The build directory name `load_inline(name, ...)` uses under TVM_FFI_CACHE_DIR."""
    cpp_list, cuda_list = _as_list(cpp_sources), _as_list(cuda_sources)
    if functions is None:
        fmap = {}
    elif isinstance(functions, str):
        fmap = {functions: ""}
    elif isinstance(functions, dict):
        fmap = dict(functions)
    else:
        fmap = {f: "" for f in functions}
    cpp, cuda = "\n".join(cpp_list), "\n".join(cuda_list)
    if cpp_list:  # the exports go to the C++ side when there is one
        cpp, cuda = _decorated(cpp, fmap), _decorated(cuda, {})
    else:
        cpp, cuda = _decorated(cpp, {}), _decorated(cuda, fmap)
    key = digest(cpp, cuda, None, None, fmap, _as_list(extra_cflags), _as_list(extra_cuda_cflags),
                 _as_list(extra_ldflags), _as_list(extra_include_paths), embed_cubin)
    return f"{name}_{key}"


# --- what the key does not see --------------------------------------------------------------------

_tree_digests: dict[str, str] = {}
_lock = threading.Lock()


def _tree_digest(root: str) -> str:
    """Content digest of every file under `root` (relative names and bytes), once per process."""
    with _lock:
        if root in _tree_digests:
            return _tree_digests[root]
    h = hashlib.sha256()
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            path = os.path.join(base, f)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            try:
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
            except OSError:
                h.update(b"unreadable")
    value = h.hexdigest()
    with _lock:
        _tree_digests[root] = value
    return value


def _tvm_ffi_include() -> str | None:
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.origin:
        return None
    inc = os.path.join(os.path.dirname(spec.origin), "include")
    return inc if os.path.isdir(inc) else None


def inputs_digest(cpp_sources=None, cuda_sources=None, extra_include_paths=None, **_ignored) -> str:
    """Digest of the headers a module can include: its include paths, the directories of the
    absolute `#include "..."` files in its sources (SGLang's csrc), and tvm-ffi's own headers."""
    roots = set(p for p in _as_list(extra_include_paths) if os.path.isdir(p))
    for src in _as_list(cpp_sources) + _as_list(cuda_sources):
        roots.update(os.path.dirname(p) for p in _ABS_INCLUDE.findall(src))
    inc = _tvm_ffi_include()
    if inc:
        roots.add(inc)
    h = hashlib.sha256()
    for r in sorted(roots):
        h.update(r.encode() + b"\0" + _tree_digest(r).encode())
    return h.hexdigest()


# --- loading and recording ------------------------------------------------------------------------

def find(root: str, name: str, kwargs: dict) -> tuple[str | None, str]:
    """(path of the prebuilt .so, "") or (None, why it is a miss)."""
    dirname = inline_dir_name(name, **kwargs)
    so = os.path.join(root, dirname, f"{name}.so")
    try:
        with open(os.path.join(root, dirname, RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None, f"{dirname} is not in {root}"
    if record.get("format") != FORMAT:
        return None, f"{dirname} was recorded in another format"
    arch = os.environ.get(ARCH_ENV, "")
    if record.get("arch_list") != arch:
        return None, f"{dirname} was built for {record.get('arch_list')!r}, this build asks {arch!r}"
    if record.get("inputs") != inputs_digest(**kwargs):
        return None, f"{dirname}: the headers differ from those it was built from (SGLang changed)"
    if not os.path.isfile(so):
        return None, f"{so} is missing"
    return so, ""


def writable_cache() -> str:
    """tvm-ffi's cache directory, made and checked writable (its lock file would wait forever)."""
    cache = os.environ.get("TVM_FFI_CACHE_DIR") or os.path.expanduser("~/.cache/tvm-ffi")
    prebuilt = os.environ.get(PREBUILT_ENV)
    real = os.path.realpath(cache)
    problem = None
    if real.startswith("/nix/store/") or (prebuilt and real == os.path.realpath(prebuilt)):
        problem = "is the read-only prebuilt kernel directory"
    else:
        try:
            os.makedirs(cache, exist_ok=True)
        except OSError as e:
            problem = f"cannot be created ({e.strerror})"
        if problem is None and not os.access(cache, os.W_OK | os.X_OK):
            problem = "is not writable"
    if problem:
        raise RuntimeError(f"SGLang's JIT kernel cache TVM_FFI_CACHE_DIR={cache} {problem}, and a "
                           "kernel is not among the prebuilt ones; fix: point TVM_FFI_CACHE_DIR at a "
                           "writable directory (dflashctl puts it in the instance's cache directory) or "
                           "build the missing kernel with `dflashctl kernels build`")
    return cache


def record(out: str, name: str, kwargs: dict, built_so: str) -> str:
    """Copy a module tvm-ffi just built into `out` under its key, with what it was built from."""
    dirname = inline_dir_name(name, **kwargs)
    if os.path.basename(os.path.dirname(built_so)) != dirname:
        raise RuntimeError(f"dflash kernel hook: tvm-ffi built {built_so}, but the key computed here "
                           f"is {dirname}: this tvm-ffi keys modules differently; prebuilt kernels "
                           "would never be found (update dflash_kernel_hook.py for it)")
    dest = os.path.join(out, dirname)
    os.makedirs(dest, exist_ok=True)
    shutil.copyfile(built_so, os.path.join(dest, f"{name}.so"))
    meta = {"format": FORMAT, "name": name, "arch_list": os.environ.get(ARCH_ENV, ""),
            "inputs": inputs_digest(**kwargs)}
    with open(os.path.join(dest, RECORD), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    return dest


def _say(text: str) -> None:
    print(f"[dflash kernels] {text}", file=sys.stderr, flush=True)


def wrap(load_inline, build_inline=None):
    """`load_inline` that tries the prebuilt directory first (or records what it builds)."""
    def prebuilt_load_inline(name, **kwargs):
        custom = kwargs.get("build_directory") is not None
        root, out = os.environ.get(PREBUILT_ENV), os.environ.get(RECORD_ENV)
        if out and not custom and build_inline is not None:
            built = build_inline(name, **{k: v for k, v in kwargs.items() if k != "keep_module_alive"})
            record(out, name, kwargs, built)
            import tvm_ffi
            return tvm_ffi.load_module(built, keep_module_alive=kwargs.get("keep_module_alive", True))
        if root and not custom:
            so, why = find(root, name, kwargs)
            if so:
                import tvm_ffi
                _say(f"loaded {name} from {os.path.dirname(so)}")
                return tvm_ffi.load_module(so, keep_module_alive=kwargs.get("keep_module_alive", True))
            _say(f"not prebuilt: {why}; compiling it into {writable_cache()}")
        elif not custom:
            writable_cache()
        return load_inline(name, **kwargs)
    prebuilt_load_inline.__wrapped__ = load_inline
    return prebuilt_load_inline


def patch(module) -> None:
    """Wrap `tvm_ffi.cpp.load_inline` (SGLang imports it from there at each build)."""
    if getattr(module.load_inline, "__wrapped__", None) is None:
        module.load_inline = wrap(module.load_inline, getattr(module, "build_inline", None))


def record_triton(knobs) -> None:
    """Send every kernel Triton compiles or finds to dflash_triton_cache's recorder. Set as soon as
    triton.knobs exists, because Triton reads its listener once at the start of each compile."""
    def listener(**kwargs):
        import dflash_triton_cache
        dflash_triton_cache.record(**kwargs)
    knobs.compilation.listener = listener


def _patches() -> dict:
    """Module name -> what to do with it once imported, for this process's settings."""
    patches = {}
    if os.environ.get(PREBUILT_ENV) or os.environ.get(RECORD_ENV):
        patches["tvm_ffi.cpp"] = patch
    if os.environ.get(TRITON_RECORD_ENV):
        patches["triton.knobs"] = record_triton
    return patches


class _Finder:
    """Patches each module as soon as it is imported; costs nothing in processes that never do."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, fullname, path=None, target=None):
        then = self.patches.pop(fullname, None)
        if then is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            then(module)
        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    patches = _patches()
    for name in [n for n in patches if n in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(patches))
