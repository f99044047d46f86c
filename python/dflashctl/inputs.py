"""Every file a command reads, read one way: bounded, and each way it can be unreadable one error.

A path that is missing, a directory, unreadable, a loop of symlinks, larger than the kind of file
it should be (a 4 GB file or /dev/zero must not be read whole), not UTF-8, not JSON, nested past
the parser's limit or holding a key twice (JSON readers disagree on which one wins) is refused
with what, why and the fix of the caller's choosing, under the caller's exit code.
"""

import json
import os
from pathlib import Path
from typing import Any

from dflashctl.errors import USAGE, DflashError

MiB = 1 << 20


def _shown(path) -> str:
    text = str(path)
    return repr(text) if any(c.isspace() or not c.isprintable() for c in text) or not text else text


def read_bytes(path, kind: str, fix: str, code: int, limit: int) -> bytes:
    """At most `limit` bytes of `path` (a `kind`, e.g. "settings file"); more is an error."""
    text = os.fspath(path)
    if not text or "\0" in text:
        raise DflashError(f"{_shown(text)} is not a path", "it is empty or holds a NUL byte", fix, USAGE)
    p = Path(text)
    try:
        if p.is_dir():
            raise DflashError(f"cannot read {_shown(p)}", f"it is a directory, not a {kind}", fix, code)
        with p.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise DflashError(f"cannot read {_shown(p)}", e.strerror or str(e), fix, code) from None
    if len(data) > limit:
        raise DflashError(f"{_shown(p)} is too large for a {kind}", f"over {limit} bytes",
                          f"pass the {kind} itself (a {kind} is far smaller)", code)
    return data


def read_text(path, kind: str, fix: str, code: int, limit: int) -> str:
    data = read_bytes(path, kind, fix, code, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DflashError(f"{_shown(path)} is not UTF-8 text", f"byte {e.start}: {e.reason}",
                          f"pass the {kind} itself (UTF-8 JSON or text)", code) from None


def _no_duplicates(pairs: list) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(f"the key {json.dumps(key)[:80]} appears twice in one object")
        seen[key] = value
    return seen


class _Duplicate(ValueError):
    pass


def read_json(path, kind: str, fix: str, code: int, limit: int = 64 * MiB) -> Any:
    """The JSON of `path` (a `kind`); every way it cannot be read is one DflashError(code)."""
    text = read_text(path, kind, fix, code, limit)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise DflashError(f"{_shown(path)} is not valid JSON", f"line {e.lineno} column {e.colno}: {e.msg}",
                          fix, code) from None
    except RecursionError:
        raise DflashError(f"{_shown(path)} is not a valid {kind}", "its JSON is nested too deeply", fix,
                          code) from None
    except _Duplicate as e:
        raise DflashError(f"{_shown(path)} is ambiguous", str(e),
                          "keep one of the two (JSON readers disagree on which one wins)", code) from None
