"""Native load errors made readable: which library missed which C++ symbol, demangled.

The story's host failed with sgl_kernel's `common_ops` reporting
`undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb`: a C++ function of the
torch that sgl_kernel was built against, absent from the torch installed. The dynamic loader's
message is buried in a page of text; these helpers find it and name the function.
"""

import ctypes
import re
import shutil
import subprocess

# "<library path>: undefined symbol: <name>" (dlerror's wording, also through ImportError/OSError)
UNDEFINED = re.compile(r"(?:(?P<library>/\S+?):\s+)?undefined symbol:\s*(?P<symbol>[A-Za-z0-9_.$@]+)")


def undefined_symbol(text: str) -> dict | None:
    """{'symbol', 'library', 'demangled'} of the first undefined symbol named in `text`, else None."""
    m = UNDEFINED.search(text or "")
    if not m:
        return None
    symbol = m["symbol"]
    return {"symbol": symbol, "library": m["library"], "demangled": demangle(symbol)}


def demangle(symbol: str) -> str | None:
    """The C++ name of an Itanium-mangled symbol, or None when no demangler can be had.

    c++filt (binutils) first; else libstdc++'s own __cxa_demangle, which every host running torch
    has (binutils is not part of the Nix environment's closure).
    """
    if not symbol.startswith("_Z"):
        return None
    return _cxxfilt(symbol) or _cxa_demangle(symbol)


def _cxxfilt(symbol: str) -> str | None:
    tool = shutil.which("c++filt")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out if out and out != symbol else None


def _cxa_demangle(symbol: str) -> str | None:
    try:
        lib = ctypes.CDLL("libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int(-1)
    ptr = fn(symbol.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


def describe(info: dict) -> str:
    """'c10::cuda::f(int) (_ZN...)' or, without a demangler, the mangled name alone."""
    if info.get("demangled"):
        return f"{info['demangled']} ({info['symbol']})"
    return info["symbol"]
