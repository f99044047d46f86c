"""The paths a rendered unit references, checked on the host that renders it (`unit`, `router-unit`).

One rule (unit_text.unit_path_problem; unitPathProblem in Nix for the module): absolute, and not
below what the unit's sandbox hides (ProtectHome=true hides /home, /root and /run/user, PrivateTmp
=true /tmp and /var/tmp). Here the rule also follows the host's symlinks, as systemd will:

- an executable given under a hidden directory whose symlinks lead into the Nix store (what
  `nix profile install` puts in ~/.nix-profile/bin) is rendered as the first store path on that
  way, which the service can run; anything else hidden is refused with the fix;
- a path that is not hidden but leads into a hidden directory (a venv whose python links to
  ~/.pyenv) is refused too: systemd would follow the link into nothing;
- a script's `#!` interpreter (a venv's bin/python) must pass the same rule, as must the
  directory this dflashctl is imported from when the unit runs this dflashctl.

Without the path on this host (a unit rendered for another machine) only the text is checked;
with it, the directory part is named as resolved (no `..`, no directory links), the file as given.
Credential files (apiKeyFile, hfTokenFile) are read by systemd before the sandbox exists: they may
live anywhere, but one missing here is named at render time (`missing_credentials`).
"""

import os
from pathlib import Path

from dflashctl.errors import CONFIG, DflashError
from dflashctl.service import unit_text

STORE = "/nix/store"  # builtins.storeDir; tests point it elsewhere
MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one lookup
VENV_FIX = ("install the stack outside /home, /root and /tmp, e.g. `python3.12 -m venv /opt/dflash` "
            "(README, \"A host without NixOS\"), or `nix profile install .#dflash-env`")


def _in_store(path: str) -> bool:
    return path.startswith(STORE + "/") and len(path) > len(STORE) + 1


def store_point(path: str) -> str | None:
    """The first path inside the Nix store on the way `path`'s symlinks lead, or None."""
    parts, cur, links = [p for p in path.split("/") if p], "/", 0
    i = 0
    while i < len(parts):
        cur = os.path.join(cur, parts[i])
        i += 1
        if _in_store(cur):
            return os.path.join(cur, *parts[i:])
        if os.path.islink(cur):
            links += 1
            if links > MAX_LINKS:
                return None
            target = os.path.join(os.path.dirname(cur), os.readlink(cur))
            parts, cur, i = [p for p in os.path.normpath(target).split("/") if p] + parts[i:], "/", 0
    return None


def _refuse(flag: str, path: str, why: str, fix: str) -> DflashError:
    return DflashError(f"{flag} {path!r} cannot be used by the unit", why, fix, CONFIG)


def referenced(path: str, flag: str, fix: str) -> str:
    """`path` as the unit will name it (see the module's docstring), or DflashError(CONFIG). On this
    host its directory is named as resolved (`..` and directory links gone); the file itself is
    kept, since a venv's bin/python must be run through its own name."""
    exists = path.startswith("/") and os.path.lexists(path)
    if exists and os.path.basename(path) not in ("", ".", ".."):
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    problem = unit_text.unit_path_problem(path)
    real = os.path.realpath(path) if exists else path
    if problem:
        store = store_point(path) if exists else None
        if store and unit_text.unit_path_problem(real) is None:
            return store
        raise _refuse(flag, path, problem, fix)
    if real != path and unit_text.unit_path_problem(real):
        raise _refuse(flag, path, f"it leads to {real}: {unit_text.unit_path_problem(real)}", fix)
    return path


def interpreter(path: str) -> str | None:
    """A script's #! interpreter (the first word after #!), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def executable(path: str, flag: str) -> str:
    """An executable for ExecStart: `referenced`, plus its #! interpreter by the same rule."""
    path = referenced(path, flag, f"{VENV_FIX}, and pass {flag} a path there")
    interp = interpreter(path)
    if interp and interp.startswith("/") and os.path.basename(interp) != "env":
        problem = unit_text.unit_path_problem(interp) or (
            unit_text.unit_path_problem(os.path.realpath(interp)) and
            f"it leads to {os.path.realpath(interp)}: {unit_text.unit_path_problem(os.path.realpath(interp))}")
        if problem:
            raise _refuse(flag, path, f"its #! line runs {interp}, and {problem}", VENV_FIX)
    return path


def package_dir() -> None:
    """The unit runs this dflashctl: the directory its code is imported from must be visible too
    (an editable install from a checkout under /home would not be)."""
    here = str(Path(__file__).resolve().parents[1])
    problem = unit_text.unit_path_problem(here)
    if problem:
        raise DflashError("this dflashctl cannot be used by the unit", f"its code is imported from {here}: {problem}",
                          f"{VENV_FIX} (`pip install ./python`, not an editable install from there), or "
                          "pass --dflashctl one installed there", CONFIG)


def missing_credentials(files: dict[str, str | None]) -> list[str]:
    """Warnings for credential files (option -> path) that do not exist on this host."""
    return [f"{option} {path} does not exist on this host: systemd will refuse to start the unit "
            f"until it does (the service then says which file it could not read)"
            for option, path in files.items() if path and not os.path.exists(path)]
