"""A JSON-Schema check for the subset the grammar phase sends; standard library only.

Covers: type (object, array, string, integer, number, boolean, null), enum, const, properties,
required, additionalProperties (false or a schema), items, minItems, maxItems, anyOf and local
`$ref`s into `$defs`. Anything else in a schema is reported as unsupported, never silently passed.
"""

SUPPORTED = {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "$schema",
             "minItems", "maxItems", "anyOf", "$ref", "$defs", "title", "description"}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def problems(value, schema: dict, root: dict | None = None, path: str = "$") -> list[str]:
    """Every way `value` breaks `schema` (empty: valid), each with its JSON path."""
    root = schema if root is None else root
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/") or ref[8:] not in root.get("$defs", {}):
            return [f"{path}: unsupported $ref {ref!r}"]
        return problems(value, root["$defs"][ref[8:]], root, path)
    out = [f"{path}: unsupported schema keyword {k!r}" for k in sorted(set(schema) - SUPPORTED)]
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not any(_TYPES[t](value) for t in names):
            return out + [f"{path}: {_show(value)} is not of type {' or '.join(names)}"]
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        out.append(f"{path}: {_show(value)} is not one of {schema['enum']}")
    if "const" in schema and not _same(value, schema["const"]):
        out.append(f"{path}: {_show(value)} is not {schema['const']!r}")
    if "anyOf" in schema:
        if all(problems(value, s, root, path) for s in schema["anyOf"]):
            out.append(f"{path}: {_show(value)} matches none of anyOf")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}: required property {key!r} is missing")
        extra = schema.get("additionalProperties", True)
        for key, v in value.items():
            if key in props:
                out += problems(v, props[key], root, f"{path}.{key}")
            elif extra is False:
                out.append(f"{path}: property {key!r} is not allowed (additionalProperties false)")
            elif isinstance(extra, dict):
                out += problems(v, extra, root, f"{path}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: {len(value)} items, fewer than minItems {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{path}: {len(value)} items, more than maxItems {schema['maxItems']}")
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(value):
                out += problems(v, schema["items"], root, f"{path}[{i}]")
    return out


def _same(a, b) -> bool:
    """JSON equality: true is not 1."""
    return type(a) is type(b) and a == b or (_TYPES["number"](a) and _TYPES["number"](b) and a == b)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
