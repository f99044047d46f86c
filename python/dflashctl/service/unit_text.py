"""Values that reach a systemd unit: refused, or escaped by systemd's own rules.

One place for what systemd does to a value, used by `dflashctl unit` and mirrored by
nix/lib/unit-text.nix for the NixOS module (tests/test_unit_text.py checks both agree):

- Control characters (newline, NUL, ...) end a unit line or a C string: refused in every setting
  (config.py calls `control_problem` on every string), since no quoting survives a newline.
- `%` starts a specifier in almost every directive (systemd.unit(5) "Specifiers"): `%%`.
- ExecStart words are C-unescaped inside double quotes and `$`-expanded at exec time
  (systemd.service(5) "Command lines"): `\\` `\"` `%%` `$$` inside "...". The executable itself
  must be "safe" (no quotes, backslashes; systemd's string_is_safe) and is not `$`-expanded while
  argv[0] is, so `$` is refused there.
- ReadWritePaths= and tmpfiles.d paths are split on whitespace with quotes removed: "..." with
  `\\` and `\"`, plus `%%`.
- LoadCredential=ID:PATH and Description= take the rest of the line literally: only `%%`.
"""

import json
import re
from functools import cache
from pathlib import Path

DATA = Path(__file__).with_name("data")


@cache
def _read(name: str) -> str:
    return (DATA / name).read_text()


def unit_data() -> dict:
    """service-unit.json: the directives, the cacheDir rules, the description template."""
    return json.loads(_read("service-unit.json"))


def router_unit_data() -> dict:
    """router-unit.json: the router unit's directives and the router settings' defaults."""
    return json.loads(_read("router-unit.json"))


def warning_texts() -> dict:
    return json.loads(_read("warnings.json"))


CONTROL = re.compile(r"[\x00-\x1f\x7f]")
PLAIN_WORD = re.compile(r"^[A-Za-z0-9/_.:+=@,%-]+$")
UNSAFE_EXEC = ('"', "'", "\\", "$")  # in this order in messages, as in Nix


def control_problem(value: str) -> str | None:
    """Why `value` cannot go into a unit or a settings file, or None."""
    found = CONTROL.findall(value)
    if not found:
        return None
    return (f"contains the control character U+{ord(min(found)):04X} (a newline, tab, NUL or similar "
            "would end or corrupt a line of the systemd unit); remove it")


def specifiers(value: str) -> str:
    return value.replace("%", "%%")


def _quoted(value: str, extra: dict[str, str]) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    for a, b in extra.items():
        out = out.replace(a, b)
    return f'"{out}"'


def exec_arg(value: str) -> str:
    """One ExecStart argument."""
    if PLAIN_WORD.match(value):
        return specifiers(value)
    return _quoted(value, {"%": "%%", "$": "$$"})


def exec_path_problem(path: str) -> str | None:
    if not path.startswith("/"):
        return "is not an absolute path (systemd needs one)"
    bad = control_problem(path)
    if bad:
        return bad
    unsafe = [c for c in UNSAFE_EXEC if c in path]
    if unsafe:
        return (f"contains {unsafe[0]!r}, which systemd refuses or expands in an executable's path; "
                "install it under a plain path")
    return None


def exec_path(path: str) -> str:
    """The executable of ExecStart (checked with exec_path_problem first)."""
    return specifiers(path) if PLAIN_WORD.match(path) else f'"{specifiers(path)}"'


def path_word(path: str) -> str:
    """A path in a whitespace-separated list (ReadWritePaths=, tmpfiles.d)."""
    return specifiers(path) if PLAIN_WORD.match(path) else _quoted(path, {"%": "%%"})


def command_line(argv: list[str]) -> str:
    return " ".join([exec_path(argv[0])] + [exec_arg(a) for a in argv[1:]])


def fill(template: str, **values: str) -> str:
    """A data-file template ({name}, {model}, ...) filled with plain replacement, as Nix does."""
    for k, v in values.items():
        template = template.replace("{" + k + "}", v)
    return template


# --- cacheDir --------------------------------------------------------------------------------------
# Where the model cache may live, from service-unit.json's "cacheDir" (the module reads it too).

PLAIN_RELATIVE = re.compile(r"^[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*(/[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*)*$")


def hidden_map(hidden: dict | None = None) -> dict[str, str]:
    """prefix -> the directive hiding it (service-unit.json's "hidden", without its comment)."""
    hidden = unit_data()["hidden"] if hidden is None else hidden
    return {k: v for k, v in hidden.items() if not k.startswith("_")}


def _components_problem(path: str) -> str | None:
    if not path.startswith("/") or any(p in (".", "..") for p in path.split("/")) or "//" in path:
        return "must be an absolute path without '.', '..' or '//' components"
    return None


def _hidden_by(path: str, hidden: dict) -> str | None:
    for prefix, directive in sorted(hidden_map(hidden).items()):
        if path == prefix or path.startswith(prefix + "/"):
            return f"{path} is hidden from the service by {directive}"
    return None


def unit_path_problem(path: str, hidden: dict | None = None) -> str | None:
    """Why a unit cannot use `path` (what it runs, its settings file, a model or driver directory),
    or None: it must be absolute and outside what the unit's sandbox hides (the module's twin:
    unitPathProblem in nix/lib/unit-text.nix)."""
    return _components_problem(path) or _hidden_by(path, hidden)


def cache_dir_problem(path: str, rules: dict, hidden: dict | None = None) -> str | None:
    """Why `path` cannot be an instance's cacheDir whoever runs it, or None."""
    bad = _components_problem(path)
    if bad:
        return bad
    bad = _hidden_by(path, hidden)
    if bad:
        return (f"{bad}; use a directory under /var/cache (systemd creates and owns it), or one like "
                "/srv/hf with a static user")
    for prefix, directive in sorted(rules["systemdOwned"].items()):
        if path.startswith(prefix):
            rel = path[len(prefix):].rstrip("/")
            if not PLAIN_RELATIVE.match(rel):
                return (f"{path}: below {prefix} it becomes {directive}={rel}, which takes plain names "
                        "only (letters, digits, '.', '_', '-', '+', '@', '/')")
    return None


def cache_dir_directives(path: str | None, rules: dict, static_user: bool) -> dict:
    """The directives that give the service its cacheDir (checked with cache_dir_problem first).

    Under /var/cache or /var/lib systemd creates the directory and owns it for the service, also
    under DynamicUser. Elsewhere only a static user can own it across starts (systemd-tmpfiles
    creates it: `tmpfiles_line`), and ReadWritePaths opens it in ProtectSystem=strict.
    Raises ValueError when that needs a static user and there is none.
    """
    if path is None:
        return {}
    for prefix, directive in sorted(rules["systemdOwned"].items()):
        if path.startswith(prefix):
            return {directive: path[len(prefix):].rstrip("/"), directive + "Mode": rules["mode"]}
    if not static_user:
        raise ValueError(
            f"{path} is outside /var/cache and /var/lib, so under DynamicUser nothing can own it; "
            "put it under /var/cache (e.g. /var/cache/hf, created by systemd for the service), or "
            "run the instance as a static user (NixOS: the instance's user option; systemd-tmpfiles "
            "then creates it for that user)")
    return {"ReadWritePaths": path_word(path)}


def tmpfiles_line(path: str, rules: dict, user: str, group: str) -> str:
    """tmpfiles.d(5) line creating a static user's cacheDir outside /var/cache and /var/lib."""
    return f"d {path_word(path)} {rules['mode']} {user} {group} -"
