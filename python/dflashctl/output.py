"""Every file a command writes, written one way: checked before the work, then whole or not at all.

- `check(path, flag)` before any work: an output path whose directory is missing or not writable,
  or that names a directory, is refused at once (exit OUTPUT), so a long run never ends in an
  error about where to put its result, and nothing is written while any check is still to come.
  `check_dir` does the same for an output directory.
- `write(path, text, flag)` and `write_all`: each text goes to a temporary file in the target's own
  directory, is flushed and fsynced, and is renamed over the target. A reader sees the old file or
  the new one, never a part of one; on a full file system (ENOSPC, EDQUOT, or EFBIG past
  RLIMIT_FSIZE: Python ignores SIGXFSZ) the temporary file is removed, the old file stays as it
  was, and the error says so. `write_all` renames only once every temporary file is written, so a
  command with two outputs leaves both or neither.
- `--json`: a command prints its JSON object with `print_json`; when it fails instead, cli.main
  prints `error_object(e)` in its place: one JSON object on stdout either way (docs/cli.md).
"""

import errno
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from dflashctl.errors import OUTPUT, USAGE, DflashError

STDOUT = "-"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _refuse(flag: str, path, why: str, fix: str) -> DflashError:
    return DflashError(f"{flag} {_shown(path)} cannot be written", why, fix, OUTPUT)


def _shown(path) -> str:
    """A path for a message: quoted where a newline or space would make the message ambiguous."""
    text = str(path)
    return repr(text) if any(c.isspace() or not c.isprintable() for c in text) or not text else text


def _plain(path, flag: str) -> Path:
    text = os.fspath(path)
    if not text:
        raise DflashError(f"{flag} is empty", "an output needs a path", f"pass {flag} PATH", USAGE)
    if "\0" in text:
        raise DflashError(f"{flag} {_shown(text)} contains a NUL byte", "no file name can hold one",
                          f"pass {flag} a plain path", USAGE)
    return Path(text)


def check(path, flag: str) -> Path | None:
    """Refuse an output file that cannot be written, before any work; None for stdout ('-' or None)."""
    if path is None or os.fspath(path) == STDOUT:
        return None
    p = _plain(path, flag)
    try:
        why, fix = _file_problem(p, flag)
    except OSError as e:  # a name longer than NAME_MAX, a directory that takes no file (/proc)
        why = e.strerror or str(e)
        fix = (f"pass {flag} a shorter path" if e.errno == errno.ENAMETOOLONG else
               f"pass {flag} a file in a directory you can write to")
    if why:
        raise _refuse(flag, p, why, fix)
    return p


def _file_problem(p: Path, flag: str) -> tuple[str | None, str]:
    fix = f"pass {flag} a file in an existing directory you can write to"
    parent = p.parent
    if p.is_dir():
        return "it is a directory", f"pass {flag} a file name in it, e.g. {p / 'out'}"
    if p.is_symlink() and not p.exists():
        return "it is a symlink to nothing", fix
    if not parent.exists():
        return (f"its directory {_shown(parent)} does not exist",
                f"create it first (mkdir -p {shlex.quote(str(parent))}), or {fix}")
    if not parent.is_dir():
        return f"{_shown(parent)} is not a directory", fix
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {_shown(parent)} is not writable (permissions or a read-only file system)", fix
    if p.exists() and not p.is_file():
        return "it exists and is not a regular file", fix
    _try_create(parent)  # permissions alone do not say it (root, /proc, a full inode table)
    return None, ""


def _try_create(directory: Path) -> None:
    """Create and remove a file in `directory`: an OSError says it cannot take one."""
    fd, tmp = tempfile.mkstemp(prefix=".dflashctl-check.", dir=directory)
    os.close(fd)
    os.unlink(tmp)


def check_dir(path, flag: str) -> Path | None:
    """Refuse an output directory that cannot be made or written, before any work."""
    if path is None:
        return None
    p = _plain(path, flag)
    fix = f"pass {flag} a directory (an existing one, or one to create in an existing directory)"
    try:
        if p.exists() and not p.is_dir():
            raise _refuse(flag, p, "it exists and is not a directory", fix)
        probe = p if p.exists() else next((a for a in p.absolute().parents if a.exists()), None)
        if probe is None or not probe.is_dir():
            raise _refuse(flag, p, f"{_shown(probe)} is not a directory", fix)
        if not os.access(probe, os.W_OK | os.X_OK):
            raise _refuse(flag, p, f"{_shown(probe)} is not writable (permissions or a read-only file system)",
                          fix)
        if p.exists():
            _try_create(p)
        else:  # make the missing levels and take them away again: proof that they can be made
            made = []
            try:
                for level in reversed([a for a in [p.absolute(), *p.absolute().parents] if not a.exists()]):
                    level.mkdir()
                    made.append(level)
            finally:
                for level in reversed(made):
                    level.rmdir()
    except OSError as e:
        raise _refuse(flag, p, e.strerror or str(e), fix) from None
    return p


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _stage(path: Path, data: bytes, flag: str) -> str:
    """`data` in a temporary file beside `path`, flushed to disk; returns its name."""
    try:
        mode = path.stat().st_mode & 0o7777 if path.is_file() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _refuse(flag, path, e.strerror or str(e), f"pass {flag} a file in a directory you can write to")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except OSError as e:
        _unlink(tmp)
        full = e.errno in _FULL
        raise _refuse(flag, path, ("the file system is full" if e.errno != errno.EFBIG else
                                   "the file size limit (RLIMIT_FSIZE) was reached") if full else
                      (e.strerror or str(e)),
                      ("free space (or raise the limit) and run the command again; "
                       + (f"{_shown(path)} was left as it was" if path.exists() else "nothing was written"))
                      if full else f"pass {flag} a file you can write to")
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def write_all(files: list[tuple[object, str | bytes, str]]) -> None:
    """Write every (path, text, flag): all temporary files first, then every rename."""
    staged = []
    try:
        for path, text, flag in files:
            p = check(path, flag)
            data = text.encode() if isinstance(text, str) else text
            staged.append((_stage(p, data, flag), p, flag))
        for tmp, p, flag in staged:
            try:
                os.replace(tmp, p)
            except OSError as e:
                raise _refuse(flag, p, e.strerror or str(e), f"pass {flag} a file you can write to")
    finally:
        for tmp, _, _ in staged:
            if os.path.exists(tmp):
                _unlink(tmp)


def write(path, text: str | bytes, flag: str) -> None:
    """One output file, whole or not at all (path '-' or None: stdout)."""
    if path is None or os.fspath(path) == STDOUT:
        emit(text if isinstance(text, str) else text.decode())
        return
    write_all([(path, text, flag)])


def emit(text: str) -> None:
    """Text on stdout; a stdout that cannot take it (a full disk, a closed pipe) is one error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise DflashError("cannot write to standard output", e.strerror or str(e),
                          "redirect the output to a file system with space, or to a reader that stays open",
                          OUTPUT) from None


# --- JSON on stdout ---------------------------------------------------------------------------------

_json_printed = False


def print_json(obj: dict, sort_keys: bool = False) -> None:
    """The command's one JSON object on stdout."""
    global _json_printed
    emit(json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")
    _json_printed = True


def json_printed() -> bool:
    return _json_printed


def reset() -> None:
    global _json_printed
    _json_printed = False


def error_object(e: DflashError) -> dict:
    """What `--json` prints instead of the result when a command fails: `ok` false, the error as
    the message says it (what, why, fix) with the exit code, plus what the command had found so far
    (`e.result`, e.g. validate's errors and warnings)."""
    return {**(getattr(e, "result", None) or {}), "ok": False,
            "error": {"what": e.what, "why": e.why, "fix": e.fix, "exit_code": e.exit_code}}
