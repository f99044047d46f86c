"""The settings schema (data/settings.json): every instance setting once, for every reader.

config.py checks a settings file by it, sglang_args.py maps it to SGLang's argv, nix/lib/settings.nix
declares the NixOS options from the same file, and the settings table of docs/service.md is
generated from it (`python -m dflashctl.service.settings_schema docs/service.md` rewrites the table;
tests/service/test_settings_schema.py fails while it is stale). This module only reads the data: the type
checks are config.py's, the flag mapping sglang_args.py's.
"""

import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("data") / "settings.json"
MAPS = ("value", "switch", "credential", "append")
TYPES = ("text", "revision", "path", "bool", "int", "port", "fraction", "choice", "gpus", "environment", "args")
TABLE_START = "<!-- settings table: generated from python/dflashctl/service/data/settings.json by " \
              "`python -m dflashctl.service.settings_schema docs/service.md`; edit the schema, not the table -->"
TABLE_END = "<!-- end of the generated settings table -->"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per file read
class Setting:
    key: str  # the option name, "speculative.algorithm" for a grouped one
    entry: dict  # the schema's entry as written

    @property
    def group(self) -> str | None:
        return self.key.split(".", 1)[0] if "." in self.key else None

    @property
    def name(self) -> str:
        """The key within its group (the JSON key where it sits)."""
        return self.key.rsplit(".", 1)[-1]

    @property
    def attr(self) -> str:
        """The Python attribute: the name in snake_case."""
        return re.sub(r"([A-Z])", r"_\1", self.name).lower()

    @property
    def required(self) -> bool:
        return "required" in self.entry

    @property
    def default(self) -> Any:
        return self.entry.get("default")

    @property
    def sglang(self) -> dict | None:
        return self.entry.get("sglang")

    def flags(self) -> list[str]:
        """The SGLang flags this setting owns (its aliases too)."""
        sg = self.sglang or {}
        return ([sg["flag"]] if "flag" in sg else []) + list(sg.get("aliases", []))


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per file read
class Schema:
    settings: tuple[Setting, ...]
    name_rule: dict  # {"pattern", "rule", "summary"}: the instance name
    groups: dict  # group name -> {"description", "example"}

    def setting(self, key: str) -> Setting:
        return next(s for s in self.settings if s.key == key)

    def top(self) -> list[Setting]:
        return [s for s in self.settings if s.group is None]

    def in_group(self, group: str) -> list[Setting]:
        return [s for s in self.settings if s.group == group]

    def mapped_flags(self) -> dict[str, str]:
        """flag -> the setting that owns it (extraArgs may not repeat one)."""
        return {flag: s.key for s in self.settings for flag in s.flags()}


def _problems(data: dict) -> list[str]:
    """What makes the schema unusable (a typo here must not become a silent default)."""
    out = []
    keys = [e.get("key") for e in data["settings"]]
    out += [f"{k}: listed twice" for k in sorted({k for k in keys if keys.count(k) > 1})]
    for e in data["settings"]:
        key = e.get("key")
        group = key.split(".", 1)[0] if "." in key else None
        if group is not None and group not in data["groups"]:
            out.append(f"{key}: no group {group!r} in 'groups'")
        if e.get("type") not in TYPES:
            out.append(f"{key}: type {e.get('type')!r} is not one of {', '.join(TYPES)}")
        if ("default" in e) == ("required" in e):
            out.append(f"{key}: give exactly one of 'default' and 'required'")
        if e.get("type") == "int" and e.get("min") not in (0, 1):  # NixOS: ints.unsigned, ints.positive
            out.append(f"{key}: an int needs min 0 or 1")
        if e.get("type") == "choice" and not e.get("choices"):
            out.append(f"{key}: a choice needs its choices")
        sg = e.get("sglang")
        if sg is not None and sg.get("map") not in MAPS:
            out.append(f"{key}: sglang.map {sg.get('map')!r} is not one of {', '.join(MAPS)}")
        elif sg is not None and sg["map"] != "append" and not sg.get("flag"):
            out.append(f"{key}: sglang.map {sg['map']!r} needs a flag")
        if not e.get("description"):
            out.append(f"{key}: no description")
    return out


def from_data(data: dict) -> Schema:
    problems = _problems(data)
    if problems:
        raise ValueError("settings schema: " + "; ".join(problems))
    return Schema(tuple(Setting(e["key"], e) for e in data["settings"]), data["name"], data["groups"])


@cache
def load(path: Path = SCHEMA_FILE) -> Schema:
    return from_data(json.loads(Path(path).read_text()))


# --- the docs table --------------------------------------------------------------------------------

def _default_text(s: Setting) -> str:
    if s.required:
        return "required"
    v = s.default
    return "null" if v is None else json.dumps(v) if not isinstance(v, str) else v


def _flag_text(s: Setting) -> str:
    sg = s.sglang
    if sg is None:
        return ""
    if sg["map"] == "append":
        return "appended last"
    text = f"`{sg['flag']}`" + {"switch": " when true", "credential": " with the file's text"}.get(sg["map"], "")
    aliases = sg.get("aliases", [])
    return text + (f" (alias {', '.join(f'`{a}`' for a in aliases)})" if aliases else "")


def _effect_text(s: Setting) -> str:
    parts = []
    if s.entry["type"] == "choice":
        parts.append("one of " + ", ".join(f"`{c}`" for c in s.entry["choices"]))
    if s.entry["summary"]:
        parts.append(s.entry["summary"])
    return "; ".join(parts)


def docs_table(schema: Schema) -> str:
    """The settings table of docs/service.md, between its markers."""
    def row(*cells: str) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
    rows = [TABLE_START, row("key", "default", "SGLang", "effect"), "|---|---|---|---|",
            row("`name`", "(instance key)", "", f"{schema.name_rule['rule']}: {schema.name_rule['summary']}")]
    rows += [row(f"`{s.key}`", _default_text(s), _flag_text(s), _effect_text(s)) for s in schema.settings]
    return "\n".join(rows + [TABLE_END])


def with_table(text: str, schema: Schema) -> str:
    """`text` (docs/service.md) with its generated table replaced by the schema's."""
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    return text[:start] + docs_table(schema) + text[end:]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dflashctl.service.settings_schema docs/service.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        print(f"{path} has no generated settings table: put these two lines where it goes, then run "
              f"this again:\n{TABLE_START}\n{TABLE_END}", file=sys.stderr)
        return 1
    path.write_text(with_table(text, load()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
