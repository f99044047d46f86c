"""Read the command line SGLang accepts from its wheel, once, into server-args-<version>.json.

    python tests/data/sglang/extract_flags.py WHEEL [OUT.json]

WHEEL is the locked sglang wheel (nix/python-lock.json names it and its sha256; `pip download
--no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_34_x86_64 sglang==0.5.11`
fetches it). The parser is built the way SGLang builds it (`ServerArgs.add_cli_args` on an
`argparse.ArgumentParser`), but without importing SGLang: the function's source is taken from
`sglang/srt/server_args.py` inside the zip and run against stand-ins for the names it uses
(the module's constant lists, the parsers' name tables read from their modules' source, type
converters by name). What the parser then holds is written out as facts: each argument's option
strings, whether and how many values it takes, its choices, type name and default. No help text,
no code. The stand-ins in tests/ (fake_sglang, service/standin_server.py) parse their argv with
these facts (tests/data/sglang/strict_args.py), so a flag SGLang does not have fails tier 1 the
way it fails on a host: argparse's exit 2.
"""

import argparse
import ast
import hashlib
import json
import sys
import zipfile
from pathlib import Path

SERVER_ARGS = "sglang/srt/server_args.py"
NAME_TABLES = {  # name used in add_cli_args -> (module in the wheel, class, dict attribute)
    "ReasoningParser": ("sglang/srt/parser/reasoning_parser.py", "ReasoningParser", "DetectorMap"),
    "FunctionCallParser": ("sglang/srt/function_call/function_call_parser.py", "FunctionCallParser",
                           "ToolCallParserEnum"),
}
COMMON = "sglang/srt/utils/common.py"
CONVERTERS = ("human_readable_int", "json_list_type", "nullable_str")  # utils.common, kept by name
ACTIONS = ("LoRAPathAction", "DeprecatedAction", "DeprecatedStoreTrueAction")  # classes of server_args.py


def _module(zf: zipfile.ZipFile, name: str) -> ast.Module:
    return ast.parse(zf.read(name).decode())


def _constants(tree: ast.Module, namespace: dict) -> None:
    """Top-level assignments that evaluate with what is known so far (lists of choices, mostly)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = eval(compile(ast.Expression(node.value), "<constant>", "eval"), dict(namespace))
            except Exception:  # a call into the rest of SGLang: not a constant the parser needs
                continue
            for t in node.targets:
                namespace[t.id] = value


def _dict_keys(tree: ast.Module, cls: str, attr: str) -> list[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else (
                    item.targets[0] if isinstance(item, ast.Assign) else None)
                if isinstance(target, ast.Name) and target.id == attr and isinstance(item.value, ast.Dict):
                    return [k.value for k in item.value.keys]
    raise SystemExit(f"{cls}.{attr} not found")


def _field_defaults(cls: ast.ClassDef) -> dict:
    """ServerArgs' dataclass fields with a literal default (others: None, as for a factory)."""
    out = {}
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            try:
                out[item.target.id] = ast.literal_eval(item.value) if item.value is not None else None
            except ValueError:
                out[item.target.id] = None
    return out


def _renames(cls: ast.ClassDef) -> dict:
    """from_cli_args' `args.field = args.dest` lines: the parser's dest -> the ServerArgs field."""
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_cli_args")
    out = {}
    for node in fn.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Attribute)):
            out[node.value.attr] = node.targets[0].attr
    return out


def _named(name: str):
    def convert(value):
        raise NotImplementedError(name)
    convert.__name__ = name
    return convert


def server_args_class(zf: zipfile.ZipFile) -> ast.ClassDef:
    tree = _module(zf, SERVER_ARGS)
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")


def build_parser(zf: zipfile.ZipFile) -> argparse.ArgumentParser:
    tree = _module(zf, SERVER_ARGS)
    namespace: dict = {"argparse": argparse, "json": json, "__name__": "server_args_facts"}
    common = _module(zf, COMMON)
    _constants(common, namespace)
    _constants(tree, namespace)
    for name, (path, cls, attr) in NAME_TABLES.items():
        keys = _dict_keys(_module(zf, path), cls, attr)
        namespace[name] = type(name, (), {attr: dict.fromkeys(keys)})
    for name in CONVERTERS:
        namespace[name] = _named(name)
    namespace["print_deprecated_warning"] = lambda message: None
    server_args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    namespace["ServerArgs"] = type("ServerArgs", (), _field_defaults(server_args))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ACTIONS:
            exec(compile(ast.Module([node], []), SERVER_ARGS, "exec"), namespace)
    add = next(n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    add.decorator_list = []
    exec(compile(ast.Module([add], []), SERVER_ARGS, "exec"), namespace)
    parser = argparse.ArgumentParser(prog="sglang serve")  # prepare_server_args' parser
    namespace["add_cli_args"](parser)
    return parser


KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
         "_StoreConstAction": "store_const", "_AppendAction": "append", "BooleanOptionalAction": "boolean_optional",
         "LoRAPathAction": "store", "DeprecatedAction": "deprecated", "DeprecatedStoreTrueAction": "store_true"}


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return sorted(value) if isinstance(value, (set, frozenset)) else repr(value)


def facts(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        kind = KINDS[type(a).__name__]
        typ = getattr(a.type, "__name__", None)
        entry = {"flags": list(a.option_strings), "dest": a.dest, "action": kind, "nargs": a.nargs,
                 "type": {"loads": "json"}.get(typ, typ),
                 "choices": sorted(a.choices) if isinstance(a.choices, (set, frozenset)) else (
                     list(a.choices) if a.choices is not None else None),
                 "required": a.required, "default": _jsonable(a.default)}
        if kind == "store_const":
            entry["const"] = _jsonable(a.const)
        out.append(entry)
    return out


def main(argv: list[str]) -> None:
    wheel = Path(argv[1])
    out = Path(argv[2]) if len(argv) > 2 else None
    data = wheel.read_bytes()
    with zipfile.ZipFile(wheel) as zf:
        version = wheel.name.split("-")[1]
        doc = {
            "what": "the arguments SGLang's server parser accepts (ServerArgs.add_cli_args), as facts",
            "sglang": version,
            "wheel": {"file": wheel.name, "sha256": hashlib.sha256(data).hexdigest()},
            "source": SERVER_ARGS,
            "extracted_by": "tests/data/sglang/extract_flags.py",
            "prog": "sglang serve",
            "arguments": facts(build_parser(zf)),
            # what /server_info returns: ServerArgs' fields, set from the parsed dests (renamed ones too)
            "fields": list(_field_defaults(server_args_class(zf))),
            "renames": _renames(server_args_class(zf)),
        }
    text = json.dumps(doc, indent=1) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv)
