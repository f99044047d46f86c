"""Values that reach a systemd unit: refused, or escaped by systemd's own rules.

One place for what systemd does to a value, used by `dflashctl unit` and mirrored by
nix/lib/unit-text.nix for the NixOS module (tests/service/test_unit_text.py checks both agree). The
refusals' rules and texts (which code points, which path components, where a cache may live) are
data in service-unit.json, read by both; the escaping below is systemd's own syntax:

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


def warning_texts() -> dict:
    return json.loads(_read("warnings.json"))


def _control_class() -> re.Pattern:
    """The refused code points of service-unit.json's "controlCharacters" as one character class."""
    ranges = unit_data()["controlCharacters"]["ranges"]
    return re.compile("[" + "".join(f"\\x{lo:02x}-\\x{hi:02x}" for lo, hi in ranges) + "]")


CONTROL = _control_class()
PLAIN_WORD = re.compile(r"^[A-Za-z0-9/_.:+=@,%-]+$")
UNSAFE_EXEC = ('"', "'", "\\", "$")  # in this order in messages, as in Nix


def control_problem(value: str) -> str | None:
    """Why `value` cannot go into a unit or a settings file, or None."""
    found = CONTROL.findall(value)
    if not found:
        return None
    return fill(unit_data()["controlCharacters"]["problem"], code=f"{ord(min(found)):04X}")


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
    """A data-file template ({name}, {model}, ...) filled in one pass, as Nix's replaceStrings does
    (a value holding "{rel}" stays as it is)."""
    if not values:
        return template
    keys = re.compile("|".join(re.escape("{" + k + "}") for k in values))
    return keys.sub(lambda m: values[m.group(0)[1:-1]], template)


# --- paths and cacheDir ----------------------------------------------------------------------------
# What a unit may reference and where the model cache may live: service-unit.json's "paths",
# "hidden" and "cacheDir" hold the rules and their texts (nix/lib/unit-text.nix reads the same).

def hidden_map(hidden: dict | None = None) -> dict[str, str]:
    """prefix -> the directive hiding it (service-unit.json's "hidden", without its comment)."""
    hidden = unit_data()["hidden"] if hidden is None else hidden
    return {k: v for k, v in hidden.items() if not k.startswith("_")}


def _components_problem(path: str) -> str | None:
    rules = unit_data()["paths"]
    if not path.startswith("/") or "//" in path or any(p in rules["badComponents"] for p in path.split("/")):
        return rules["componentsProblem"]
    return None


def _hidden_by(path: str, hidden: dict | None) -> str | None:
    for prefix, directive in sorted(hidden_map(hidden).items()):
        if path == prefix or path.startswith(prefix + "/"):
            return fill(unit_data()["paths"]["hiddenProblem"], path=path, directive=directive)
    return None


def unit_path_problem(path: str, hidden: dict | None = None) -> str | None:
    """Why a unit cannot use `path` (what it runs, its settings file, a model or driver directory),
    or None: it must be absolute and outside what the unit's sandbox hides (the module's twin:
    unitPathProblem in nix/lib/unit-text.nix)."""
    return _components_problem(path) or _hidden_by(path, hidden)


def _owned_by(path: str, rules: dict) -> tuple[str, str, str] | None:
    """(prefix, directive, the path below it) where systemd creates and owns `path`, or None."""
    for prefix, directive in sorted(rules["systemdOwned"].items()):
        if path.startswith(prefix):
            return prefix, directive, path[len(prefix):].rstrip("/")
    return None


def cache_dir_problem(path: str, rules: dict, hidden: dict | None = None) -> str | None:
    """Why `path` cannot be an instance's cacheDir whoever runs it, or None (`rules`:
    service-unit.json's "cacheDir")."""
    bad = _components_problem(path)
    if bad:
        return bad
    bad = _hidden_by(path, hidden)
    if bad:
        return fill(rules["hiddenProblem"], problem=bad)
    owned = _owned_by(path, rules)
    if owned and not re.fullmatch(rules["plainRelative"], owned[2]):
        prefix, directive, rel = owned
        return fill(rules["notPlainProblem"], path=path, prefix=prefix, directive=directive, rel=rel)
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
    owned = _owned_by(path, rules)
    if owned:
        _, directive, rel = owned
        return {directive: rel, directive + "Mode": rules["mode"]}
    if not static_user:
        raise ValueError(fill(rules["needsUserProblem"], path=path))
    return {"ReadWritePaths": path_word(path)}


def tmpfiles_line(path: str, rules: dict, user: str, group: str) -> str:
    """tmpfiles.d(5) line creating a static user's cacheDir outside /var/cache and /var/lib."""
    return f"d {path_word(path)} {rules['mode']} {user} {group} -"
