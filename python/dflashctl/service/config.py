"""Instance settings: the JSON that `services.dflash.instances.<name>` writes, its defaults and rules.

One instance is one SGLang server. Its settings are data/settings.json's (settings_schema.py
reads it): the JSON keys are the NixOS option names (camelCase), the attributes of the frozen
dataclasses made from the schema the same names in snake_case, and each value is checked by its
entry's type. Loading checks types and ranges of one instance and lists every problem at once;
rules that span instances live in `validate.py`. Unknown keys are errors: a typo must not be
silently ignored. Every function that reads the schema takes another one (`schema=`), which is how
tests/service/test_settings_schema.py follows a throw-away setting through.
"""

import difflib
import json
import re
from dataclasses import field, make_dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dflashctl import inputs
from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import hub_cache
from dflashctl.service import settings_schema, sglang_0_5_11, unit_text

SCHEMA = settings_schema.load()  # data/settings.json: every setting's key, type, default and flag
ALGORITHMS = tuple(SCHEMA.setting("speculative.algorithm").entry["choices"])
NEEDS_DRAFT = ("DFLASH", "DDTREE", "EAGLE3")
GRAMMAR_BACKENDS = tuple(SCHEMA.setting("grammarBackend").entry["choices"])
NAME_RE = re.compile(SCHEMA.name_rule["pattern"])  # always fullmatch: `$` would let "a\n" pass
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Every text value reaches the unit file or SGLang's argv: systemd refuses unit lines over 1 MiB
# (LONG_LINE_MAX) and Linux one argument over 128 KiB (MAX_ARG_STRLEN). A model id or path fits in
# PATH_MAX; a settings file is a few KiB.
MAX_TEXT = 4096
MAX_ITEMS = 256  # extraArgs entries, environment variables
MAX_FILE = 1 << 20


def _base_url(self) -> str:
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
    return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


PYTHON_TYPES = {"text": str, "revision": str, "path": str, "bool": bool, "int": int, "port": int,
                "fraction": float, "choice": str, "gpus": tuple[int, ...], "environment": dict[str, str],
                "args": tuple[str, ...]}


def _field(s: settings_schema.Setting) -> tuple:
    """(attribute, annotation, field) of one setting in its frozen dataclass."""
    kind = PYTHON_TYPES[s.entry["type"]]
    kind = kind | None if s.entry.get("null") else kind
    if s.required:
        return s.attr, kind
    default = s.default
    if isinstance(default, dict):
        return s.attr, kind, field(default_factory=lambda d=default: dict(d))
    return s.attr, kind, field(default=tuple(default) if isinstance(default, list) else default)


@cache
def dataclasses_of(schema: settings_schema.Schema) -> tuple[type, dict[str, type]]:
    """The frozen dataclasses of `schema`: one instance's settings and one per group (speculative)."""
    groups = {g: make_dataclass(g.capitalize(), [_field(s) for s in schema.in_group(g)], frozen=True,
                                namespace={"__module__": __name__})
              for g in schema.groups}
    fields = [("name", str)] + [_field(s) for s in schema.top() if s.required] \
        + [(g, cls, field(default_factory=cls)) for g, cls in groups.items()] \
        + [_field(s) for s in schema.top() if not s.required]
    instance = make_dataclass("InstanceConfig", fields, frozen=True,
                              namespace={"base_url": property(_base_url), "__module__": __name__})
    return instance, groups


# One instance is one SGLang server: its settings as attributes (`cfg.tp_size`, `cfg.speculative.algorithm`).
InstanceConfig, _GROUPS = dataclasses_of(SCHEMA)
Speculative = _GROUPS["speculative"]


# --- types -----------------------------------------------------------------------------------------
# Each checker returns the converted value or raises ValueError with a phrase completing
# "<key> must be ...".

def _str(v):
    if not isinstance(v, str) or not v.strip():
        raise ValueError("a non-empty string")
    return _short(v)


def _short(v: str) -> str:
    if len(v) > MAX_TEXT:
        raise ValueError(f"at most {MAX_TEXT} characters long (it has {len(v)})")
    return v


def _opt(check):
    return lambda v: None if v is None else check(v)


def _bool(v):
    if not isinstance(v, bool):
        raise ValueError("true or false")
    return v


def _int(lo, hi=None):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise ValueError(f"an integer from {lo} to {hi}" if hi is not None else f"an integer >= {lo}")
        return v
    return check


def _choice(*choices):
    def check(v):
        if v not in choices:
            raise ValueError("one of " + ", ".join(json.dumps(c) for c in choices))
        return v
    return check


def _fraction(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError("a number greater than 0 and at most 1")
    return float(v)


def _abs_path(v):
    if not isinstance(v, str) or not v.startswith("/"):
        raise ValueError("an absolute path")
    return _short(v)


REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


def _revision(v):
    if not isinstance(v, str) or not REVISION_RE.fullmatch(v) or ".." in v:
        raise ValueError("a commit hash (40 hex digits) or a branch/tag name")
    return v


def _gpus(v):
    if not isinstance(v, list) or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in v):
        raise ValueError("a list of GPU indices (integers >= 0), e.g. [0, 1]")
    if len(set(v)) != len(v):
        raise ValueError("a list without repeats")  # the caller adds "(got [...])"
    return tuple(v)


def _environment(v):
    if not isinstance(v, dict):
        raise ValueError('an object of strings, e.g. {"NCCL_DEBUG": "WARN"}')
    if len(v) > MAX_ITEMS:
        raise ValueError(f"an object of at most {MAX_ITEMS} variables")
    for k, val in v.items():
        if not ENV_NAME_RE.fullmatch(k) or len(k) > MAX_TEXT:
            raise ValueError(f"an object whose keys are variable names ({_cut(repr(k))} is not)")
        if not isinstance(val, str):
            raise ValueError(f"an object of strings ({k} is {_brief(val)}; quote it)")
        if len(val) > MAX_TEXT:
            raise ValueError(f"an object of strings of at most {MAX_TEXT} characters ({k} has {len(val)})")
    return dict(v)


def _extra_args(v):
    if not isinstance(v, list) or any(not isinstance(a, str) for a in v):
        raise ValueError('a list of strings, e.g. ["--max-running-requests", "64"]')
    if len(v) > MAX_ITEMS or any(len(a) > MAX_TEXT for a in v):
        raise ValueError(f"a list of at most {MAX_ITEMS} strings of at most {MAX_TEXT} characters each")
    return tuple(v)


GRPC_PORT_OFFSET, MAX_PORT = sglang_0_5_11.GRPC_PORT_OFFSET, sglang_0_5_11.MAX_PORT  # port + 10000 <= 65535

CHECKS = {"text": _str, "revision": _revision, "path": _abs_path, "bool": _bool, "port": _int(1, 65535),
          "fraction": _fraction, "gpus": _gpus, "environment": _environment, "args": _extra_args}


def _check(s: settings_schema.Setting):
    """The checker of one setting's value, from its schema entry."""
    e = s.entry
    if e["type"] == "int":
        check = _int(e["min"], e.get("max"))
    elif e["type"] == "choice":
        check = _choice(*e["choices"])
    else:
        check = CHECKS[e["type"]]
    return _opt(check) if e.get("null") else check


@cache
def keys_of(schema: settings_schema.Schema, group: str | None = None) -> dict:
    """JSON key -> (attribute, checker) of the top-level settings, or of one group's."""
    chosen = schema.top() if group is None else schema.in_group(group)
    return {s.name: (s.attr, _check(s)) for s in chosen}


KEYS = keys_of(SCHEMA)  # `name` and the groups (`speculative`) are handled in problems_of
SPECULATIVE_KEYS = keys_of(SCHEMA, "speculative")


def _unknown(keys, known, where: str) -> list[str]:
    out = []
    for k in sorted(set(keys) - set(known)):
        close = difflib.get_close_matches(k, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.append(f"{where}{k}: unknown setting{hint}")
    return out


def _convert(d: dict, keys: dict, prefix: str, problems: list[str]) -> dict:
    """Check and convert the keys of `d` that `keys` knows; each bad value becomes a problem."""
    out = {}
    for key, (attr, check) in keys.items():
        if key in d:
            try:
                out[attr] = check(d[key])
            except ValueError as e:
                problems.append(f"{prefix}{key}: must be {e} (got {_brief(d[key])})")
    return out


def _control_characters(value: Any, where: str) -> list[str]:
    """Every string (keys too) reaches the unit or the process environment: no control characters."""
    if isinstance(value, str):
        bad = unit_text.control_problem(value)
        return [f"{where}: {bad} (got {json.dumps(value)})"] if bad else []
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _control_characters(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            key = f"{where}.{k}" if where else str(k)
            out += _control_characters(k, f"{key} (the name)") + _control_characters(v, key)
        return out
    return []


def _group(d: dict, group: str, schema: settings_schema.Schema, problems: list[str]):
    """One group's object (`speculative`), checked key by key so that every problem is listed."""
    cls = dataclasses_of(schema)[1][group]
    value = d.get(group)
    if value is None:
        return cls()
    if not isinstance(value, dict):
        first = schema.in_group(group)[0]
        example = json.dumps({first.name: first.entry["example"]})
        problems.append(f"{group}: must be an object, e.g. {example} (got {_brief(value)})")
        return cls()
    keys = keys_of(schema, group)
    problems += _unknown(value, keys, f"{group}.")
    return cls(**_convert(value, keys, f"{group}.", problems))


def problems_of(d: Any, name: str | None = None,
                schema: settings_schema.Schema = SCHEMA) -> tuple[list[str], dict]:
    """Check one instance's JSON. Returns (problems, converted keyword arguments)."""
    if not isinstance(d, dict):
        return ["the settings must be a JSON object"], {}
    keys = keys_of(schema)
    problems = _unknown(d, {"name", *schema.groups, *keys}, "") + _control_characters(d, "")
    kwargs: dict[str, Any] = {}
    inst_name = d.get("name", name)
    if name is not None and "name" in d and d["name"] != name:
        problems.append(f"name: {_cut(repr(d['name']))} differs from the instance's key {_cut(repr(name))}")
    if not isinstance(inst_name, str) or not NAME_RE.fullmatch(inst_name):
        problems.append(f"name: {_cut(repr(inst_name))} must be {schema.name_rule['rule']} "
                        "(it becomes part of the systemd unit name)")
    kwargs["name"] = inst_name
    problems += [f"{s.key}: required ({s.entry['required']})" for s in schema.top()
                 if s.required and s.name not in d]
    kwargs.update(_convert(d, keys, "", problems))
    for group in schema.groups:
        kwargs[group] = _group(d, group, schema, problems)
    if not problems:
        problems += _rules(kwargs, schema)
    return problems, kwargs


def _rules(kw: dict, schema: settings_schema.Schema) -> list[str]:
    """Rules within one instance (written once; the module runs them at build time)."""
    out = []
    spec: Speculative = kw["speculative"]
    algo = spec.algorithm
    if algo in NEEDS_DRAFT and not kw.get("draft_model"):
        out.append(f"speculative.algorithm: {algo} needs draftModel (the drafter's repo id or "
                   "directory, e.g. z-lab/Qwen3-8B-DFlash-b16 for Qwen/Qwen3-8B)")
    if algo is None:
        for key, attr in (("numDraftTokens", "num_draft_tokens"), ("ddtreeBudget", "ddtree_budget"),
                          ("draftAttentionBackend", "draft_attention_backend")):
            if getattr(spec, attr) is not None:
                out.append(f"speculative.{key}: set, but speculative.algorithm is null; "
                           "set an algorithm or remove it")
        if kw.get("draft_model"):
            out.append("draftModel: set, but speculative.algorithm is null; set "
                       'speculative.algorithm (e.g. "DFLASH") or remove draftModel')
        if kw.get("draft_load_format"):
            out.append("draftLoadFormat: set, but speculative.algorithm is null")
    for key, model_key, model in (("modelRevision", "model", kw.get("model")),
                                  ("draftModelRevision", "draftModel", kw.get("draft_model"))):
        rev = kw.get("model_revision" if key == "modelRevision" else "draft_model_revision")
        if rev is None:
            continue
        if model is None:
            out.append(f"{key}: set, but {model_key} is not")
        elif hub_cache.is_local(model):
            out.append(f"{key}: {model_key} {model!r} is a local directory, which has no hub "
                       f"revision; remove {key} (pin a local model by its path)")
    if spec.ddtree_budget is not None and algo not in (None, "DDTREE"):
        out.append(f"speculative.ddtreeBudget: only DDTREE uses a tree budget, not {algo}; remove it")
    gpus = kw.get("gpus", ())
    tp = kw.get("tp_size", 1)
    if gpus and tp > len(gpus):
        out.append(f"tpSize: {tp} is larger than the {len(gpus)} GPU(s) given in gpus {list(gpus)}; "
                   f"list {tp} GPUs or lower tpSize")
    env = kw.get("environment", {})
    port = kw.get("port", InstanceConfig.port)
    if port > MAX_PORT and sglang_0_5_11.GRPC_PORT_ENV not in env:
        out.append(f"port: {port} is above {MAX_PORT}: SGLang 0.5.11 derives its gRPC port as port + "
                   f"{GRPC_PORT_OFFSET} and refuses to start past 65535; choose a port <= {MAX_PORT} "
                   "or set environment.SGLANG_GRPC_PORT")
    for secret in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if secret in env:
            out.append(f"environment.{secret}: the environment ends up in the unit and the Nix store, "
                       "which every user can read; put the token in a file and set hfTokenFile")
    if gpus and "CUDA_VISIBLE_DEVICES" in env:
        out.append("environment.CUDA_VISIBLE_DEVICES: conflicts with gpus; set the GPUs with gpus only")
    owners = schema.mapped_flags()
    for arg in kw.get("extra_args", ()):
        flag = arg.split("=", 1)[0]
        if flag in owners:
            out.append(f"extraArgs: {flag} is set by the option {owners[flag]}; use that option")
    return out


def from_dict(d: Any, name: str | None = None, origin: str = "settings",
              schema: settings_schema.Schema = SCHEMA) -> InstanceConfig:
    """One instance from its JSON object; raises DflashError(CONFIG) listing every problem."""
    problems, kwargs = problems_of(d, name, schema)
    if problems:
        who = kwargs.get("name") or name or "?"
        raise DflashError(f"invalid settings for instance {who!r} in {origin}",
                          f"{len(problems)} problem(s)\n  - " + "\n  - ".join(problems),
                          "correct the settings above (keys as in services.dflash.instances.<name>; "
                          "docs/service.md lists them)", CONFIG)
    return dataclasses_of(schema)[0](**kwargs)


def to_dict(cfg: InstanceConfig, schema: settings_schema.Schema = SCHEMA) -> dict:
    """The settings JSON of `cfg` with every key set: what from_dict reads back as `cfg`, and the
    module's settings file for the same options."""
    def plain(v):
        return list(v) if isinstance(v, tuple) else v
    groups = {g: {key: plain(getattr(getattr(cfg, g), attr)) for key, (attr, _) in keys_of(schema, g).items()}
              for g in schema.groups}
    return {"name": cfg.name, **groups,
            **{key: plain(getattr(cfg, attr)) for key, (attr, _) in keys_of(schema).items()}}


def _brief(value) -> str:
    """A value as JSON for a message, cut short: a 4 MB string must not become a 4 MB error."""
    return _cut(json.dumps(value))


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def read_json(path: Path | str) -> Any:
    """The settings file's JSON; every way it can be unreadable is one CONFIG error."""
    return inputs.read_json(path, "settings file", "pass the settings file the module or `dflashctl unit` "
                            "wrote (UTF-8 JSON)", CONFIG, MAX_FILE)


def _instances(data: Any, origin: str) -> dict | None:
    """A file's {"instances": {...}} (what `validate` and `models` read too), or None for one instance."""
    if not (isinstance(data, dict) and "instances" in data):
        return None
    if set(data) != {"instances"} or not isinstance(data["instances"], dict) or not data["instances"]:
        raise DflashError(f"{origin} is not a settings file", 'a file with "instances" must hold only '
                          '{"instances": {"<name>": {...}, ...}}, with at least one instance',
                          "write one instance's settings, or every instance under \"instances\"", CONFIG)
    return data["instances"]


def instance_of(data: Any, name: str | None, origin: str) -> tuple[str | None, Any]:
    """(key, settings) of the one instance a file holds, or of the one `name` selects in a file of
    several ({"instances": {...}}); key is None for a file of one instance."""
    instances = _instances(data, origin)
    if instances is None:
        return None, data
    names = ", ".join(sorted(map(str, instances)))
    if name is None:
        if len(instances) == 1:
            return next(iter(instances.items()))
        raise DflashError(f"{origin} holds {len(instances)} instances", names,
                          "pass --name NAME to choose one", CONFIG)
    if name not in instances:
        raise DflashError(f"{origin} has no instance {name!r}", f"it holds {names}",
                          "pass --name one of them", CONFIG)
    return name, instances[name]


def load(path: Path | str, name: str | None = None) -> InstanceConfig:
    """The instance in `path` (what the module writes for `dflashctl serve --config`), or the one
    `name` selects in a file of several."""
    key, data = instance_of(read_json(path), name, str(path))
    cfg = from_dict(data, name=key, origin=str(path))
    if name is not None and cfg.name != name:
        raise DflashError(f"{path} has no instance {name!r}", f"it holds instance {cfg.name!r}",
                          f"pass --name {cfg.name}, or leave --name out", CONFIG)
    return cfg


def load_all(path: Path | str) -> list[InstanceConfig]:
    """Every instance in `path`: one, or each of {"instances": {...}} (sorted by name)."""
    data = read_json(path)
    instances = _instances(data, str(path))
    if instances is None:
        return [from_dict(data, origin=str(path))]
    return [from_dict(v, name=k, origin=str(path)) for k, v in sorted(instances.items())]
