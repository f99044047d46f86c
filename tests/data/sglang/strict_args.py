"""SGLang 0.5.11's server command line, rebuilt from facts, for the stand-ins in tests/.

server-args-0.5.11.json (written by extract_flags.py from the locked wheel) lists every argument
`ServerArgs.add_cli_args` defines: option strings, values taken, choices, type, default. `parser()`
turns that into an argparse parser with the same program name, so an argv SGLang would refuse is
refused here the same way: argparse's usage line, "unrecognized arguments" or "invalid choice",
exit status 2. Standard library only: the stand-ins run under any interpreter.

`ddtree=True` adds what the DDTree change (an open upstream pull request, not in any release)
adds to the parser: DDTREE among --speculative-algorithm's choices and --speculative-ddtree-budget.
"""

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
FACTS = HERE / "server-args-0.5.11.json"
DDTREE_PATCH = {"choice": "DDTREE", "flag": "--speculative-ddtree-budget"}


def human_readable_int(value: str) -> int:
    """An integer with an optional SI (k, M, G, T; decimals allowed) or IEC (Ki .. Ti) suffix, as
    SGLang's --context-length and --max-total-tokens take it (its documented format)."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if not m:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer with an optional suffix: {value!r}") from None
    number, suffix = m.groups()
    if suffix.endswith("i"):
        if "." in number:
            raise argparse.ArgumentTypeError(f"no decimals with an IEC suffix: {value!r}")
        return int(number) * 1024 ** ("KMGT".index(suffix[0]) + 1)
    return int(float(number) * 1000 ** ("kMGT".index(suffix) + 1))


def nullable_str(value: str):
    return None if not value or value == "None" else value


def _json(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None


TYPES = {None: None, "str": str, "int": int, "float": float, "json": _json, "json_list_type": _json,
         "human_readable_int": human_readable_int, "nullable_str": nullable_str}
for _name, _fn in TYPES.items():  # argparse names the type in "invalid X value"
    if _fn is not None and _name not in ("str", "int", "float"):
        _fn.__name__ = _name


class _Deprecated(argparse.Action):
    """An accepted flag that takes no value and sets nothing (SGLang warns and ignores it)."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        pass


def facts(path: Path = FACTS) -> dict:
    return json.loads(Path(path).read_text())


def parser(ddtree: bool = False, path: Path = FACTS) -> argparse.ArgumentParser:
    doc = facts(path)
    p = argparse.ArgumentParser(prog=doc["prog"])
    for a in doc["arguments"]:
        flags, kind = a["flags"], a["action"]
        common = {"dest": a["dest"], "default": a["default"]}
        if a["required"]:
            common["required"] = True
        if kind == "store_true":
            p.add_argument(*flags, action="store_true", **common)
        elif kind == "store_false":
            p.add_argument(*flags, action="store_false", **common)
        elif kind == "store_const":
            p.add_argument(*flags, action="store_const", const=a["const"], **common)
        elif kind == "deprecated":
            p.add_argument(*flags, action=_Deprecated, **common)
        elif kind == "boolean_optional":
            positive = [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]
            p.add_argument(*positive, action=argparse.BooleanOptionalAction, **common)
        else:
            choices = list(a["choices"]) if a["choices"] is not None else None
            if ddtree and flags[0] == "--speculative-algorithm":
                choices.append(DDTREE_PATCH["choice"])
            kwargs = {"type": TYPES[a["type"]], "choices": choices, "nargs": a["nargs"]}
            p.add_argument(*flags, action="append" if kind == "append" else "store",
                           **{k: v for k, v in kwargs.items() if v is not None}, **common)
    if ddtree:
        p.add_argument(DDTREE_PATCH["flag"], type=int, default=None, dest="speculative_ddtree_budget")
    return p


def server_info_fields(ns: argparse.Namespace, path: Path = FACTS) -> dict:
    """What /server_info reports of the arguments: every ServerArgs field, from the parsed dests
    (from_cli_args renames a few: tensor_parallel_size becomes tp_size, ...)."""
    doc = facts(path)
    values = dict(vars(ns))
    for dest, field in doc["renames"].items():
        values[field] = values.get(dest)
    out = {f: values.get(f) for f in doc["fields"]}
    if "speculative_ddtree_budget" in values:
        out["speculative_ddtree_budget"] = values["speculative_ddtree_budget"]
    return out


def parse(argv: list[str], ddtree: bool = False) -> argparse.Namespace:
    """Parse as SGLang does: an argv it refuses exits 2 with argparse's message on stderr."""
    return parser(ddtree).parse_args(argv)
