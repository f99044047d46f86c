"""The settings schema (python/dflashctl/service/data/settings.json) is the one place a setting is added.

A throw-away setting added to a copy of the schema reaches every reader: the NixOS option
(nix/lib/settings.nix, read with a recording lib, and through a real module system where a nixpkgs
lib is at hand), the settings file the module writes, dflashctl's parser, SGLang's argv and the docs
table. The shipped schema's table in docs/service.md is the generated one.
"""

import copy
import json
import re
import subprocess

import pytest

from conftest import REPO, nix_or_skip
from dflashctl.service import config, settings_schema, sglang_args
from nixeval import nix_env, nixpkgs_lib

HARNESS = REPO / "tests" / "nix" / "harness"
DOCS = REPO / "docs" / "service.md"
# Two settings SGLang 0.5.11 has and the schema does not: one plain value, one switch in a group.
THROWAWAY = [
    {"key": "maxRunningRequests", "type": "int", "min": 1, "null": True, "default": None, "example": 64,
     "description": "Requests SGLang runs at once (`--max-running-requests`).",
     "sglang": {"flag": "--max-running-requests", "map": "value"}, "summary": "requests run at once"},
    {"key": "speculative.eagleTopk", "type": "int", "min": 1, "null": True, "default": None,
     "description": "Top-k of the draft tree (`--speculative-eagle-topk`).",
     "sglang": {"flag": "--speculative-eagle-topk", "map": "value"}, "summary": ""},
    {"key": "enableThrowaway", "type": "bool", "default": False,
     "description": "A switch (`--enable-throwaway`).",
     "sglang": {"flag": "--enable-throwaway", "map": "switch"}, "summary": "a switch"},
]
SETTINGS = {"model": "m", "maxRunningRequests": 64, "enableThrowaway": True,
            "speculative": {"algorithm": "DFLASH", "eagleTopk": 4}, "draftModel": "d"}


@pytest.fixture
def schema_file(tmp_path):
    data = json.loads(settings_schema.SCHEMA_FILE.read_text())
    data = copy.deepcopy(data)
    data["settings"] += THROWAWAY
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(data))
    return path


def test_docs_table_is_the_schemas():
    text = DOCS.read_text()
    assert settings_schema.with_table(text, settings_schema.load()) == text, \
        "docs/service.md's settings table is stale: run python -m dflashctl.service.settings_schema docs/service.md"


def test_each_option_description_names_its_flag():
    for s in settings_schema.load().settings:
        if s.sglang and "flag" in s.sglang:
            assert f"`{s.sglang['flag']}`" in s.entry["description"], s.key


@pytest.mark.parametrize("change,problem", [
    (lambda d: d["settings"].append(dict(d["settings"][0])), "model: listed twice"),
    (lambda d: d["settings"][0].update(type="string"), "model: type 'string' is not one of"),
    (lambda d: d["settings"][1].pop("default"), "host: give exactly one of 'default' and 'required'"),
    (lambda d: d["settings"][1]["sglang"].update(map="flag"), "host: sglang.map 'flag' is not one of"),
    (lambda d: d["settings"].append({**THROWAWAY[1], "key": "draft.x"}), "draft.x: no group 'draft'"),
    (lambda d: d["settings"][1]["sglang"].pop("flag"), "host: sglang.map 'value' needs a flag"),
    (lambda d: d["settings"].append({**THROWAWAY[0], "min": 2}), "maxRunningRequests: an int needs min 0 or 1"),
])
def test_a_broken_schema_is_refused(change, problem):
    data = json.loads(settings_schema.SCHEMA_FILE.read_text())
    change(data)
    with pytest.raises(ValueError, match=problem):
        settings_schema.from_data(data)


def test_a_new_setting_reaches_the_parser_and_argv(schema_file):
    schema = settings_schema.load(schema_file)
    cfg = config.from_dict({"name": "a", **SETTINGS}, schema=schema)
    assert (cfg.max_running_requests, cfg.enable_throwaway, cfg.speculative.eagle_topk) == (64, True, 4)
    assert config.from_dict(config.to_dict(cfg, schema), schema=schema) == cfg
    defaults = config.from_dict({"name": "a", "model": "m"}, schema=schema)
    assert (defaults.max_running_requests, defaults.enable_throwaway) == (None, False)
    problems, _ = config.problems_of({"name": "a", "model": "m", "maxRunningRequests": 0}, schema=schema)
    assert problems == ["maxRunningRequests: must be an integer >= 1 (got 0)"]
    problems, _ = config.problems_of({"name": "a", "model": "m", "extraArgs": ["--enable-throwaway"]},
                                     schema=schema)
    assert problems == ["extraArgs: --enable-throwaway is set by the option enableThrowaway; use that option"]
    argv = sglang_args.build_argv(cfg, "py", schema=schema)
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert argv[argv.index("--speculative-eagle-topk") + 1] == "4" and "--enable-throwaway" in argv
    assert "--max-running-requests" not in sglang_args.build_argv(defaults, "py", schema=schema)
    # the shipped schema knows none of it
    problems, _ = config.problems_of({"name": "a", **SETTINGS})
    assert any(p.startswith("maxRunningRequests: unknown setting") for p in problems), problems


def test_a_new_setting_reaches_the_docs_table(schema_file):
    table = settings_schema.docs_table(settings_schema.load(schema_file))
    assert "| `maxRunningRequests` | null | `--max-running-requests` | requests run at once |" in table
    assert "| `enableThrowaway` | false | `--enable-throwaway` when true | a switch |" in table
    assert "| `speculative.eagleTopk` | null | `--speculative-eagle-topk` | |" in table


def _nix(harness: str, *args: str) -> dict:
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", str(HARNESS / harness), *args],
                       capture_output=True, text=True, env=nix_env(), timeout=300)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)


def test_a_new_setting_reaches_the_nix_options_and_the_settings_file(schema_file):
    nix_or_skip()
    schema = settings_schema.load(schema_file)
    values = config.to_dict(config.from_dict({"name": "a", **SETTINGS}, schema=schema), schema)
    options = {k: v for k, v in values.items() if k != "name"}  # every option, as the module passes them
    out = _nix("settings-schema.nix", "--argstr", "schemaFile", str(schema_file),
               "--argstr", "instanceJSON", json.dumps({**options, "user": "u"}))
    assert out["options"]["maxRunningRequests"] == {
        "type": "nullOr positive", "default": None, "hasDefault": True, "values": None,
        "description": THROWAWAY[0]["description"]}
    assert out["options"]["enableThrowaway"]["type"] == "bool"
    assert out["options"]["speculative"]["eagleTopk"]["type"] == "nullOr positive"
    assert out["options"]["model"]["hasDefault"] is False  # required
    assert out["keys"] == [s.name for s in schema.top()]
    # the module's settings file carries it (and no module-only option), read back by dflashctl
    assert out["settingsFile"] == {"name": "a", **options}
    assert "maxRunningRequests" in out["keys"] and "eagleTopk" in out["settingsFile"]["speculative"]


def test_a_new_setting_is_a_typed_option_in_the_module_system(schema_file):
    nix_or_skip()
    if nixpkgs_lib() is None:
        pytest.skip("no nixpkgs lib: set DFLASH_NIXPKGS_LIB (see tests/nix/test_module_eval.py)")
    args = ["--arg", "lib", f"import {nixpkgs_lib()}", "--argstr", "schemaFile", str(schema_file)]
    got = _nix("settings-eval.nix", *args, "--argstr", "instanceJSON", json.dumps(
        {"model": "m", "maxRunningRequests": 64, "speculative": {"eagleTopk": 2}}))
    assert (got["maxRunningRequests"], got["enableThrowaway"], got["speculative"]["eagleTopk"]) == (64, False, 2)
    assert got["port"] == 30000 and got["speculative"]["algorithm"] is None  # the shipped ones too
    with pytest.raises(RuntimeError, match="maxRunningRequests' is not of type"):
        _nix("settings-eval.nix", *args, "--argstr", "instanceJSON",
             json.dumps({"model": "m", "maxRunningRequests": 0}))


def test_the_name_control_and_cache_dir_rules_are_written_once():
    """Both languages read these rules from the data files: no source holds one of their patterns
    or texts (a copy would be free to drift from the data)."""
    unit = json.loads((REPO / "python/dflashctl/service/data/service-unit.json").read_text())
    name = settings_schema.load().name_rule
    texts = [name["pattern"], name["rule"], unit["controlCharacters"]["problem"],
             unit["cacheDir"]["plainRelative"], *unit["paths"].values(),
             *(v for k, v in unit["cacheDir"].items() if k.endswith("Problem"))]
    pieces = [max(re.split(r"\{\w+\}", t), key=len) for t in texts if isinstance(t, str)]
    pieces = [p for p in pieces if len(p) >= 15]
    assert len(pieces) >= 8, pieces
    sources = [p for p in (REPO / "python").rglob("*.py")] + list((REPO / "nix").rglob("*.nix"))
    for source in sources:
        text = source.read_text()
        found = [p for p in pieces if p in text]
        assert not found, (source, found)


def test_the_table_is_rewritten_in_place(tmp_path, capsys):
    doc = tmp_path / "service.md"
    stale = DOCS.read_text().replace("| `tpSize` | 1 |", "| `tpSize` | 2 |")
    doc.write_text(stale)
    assert settings_schema.main([str(doc)]) == 0
    assert doc.read_text() == DOCS.read_text()
    doc.write_text("# no table here\n")
    assert settings_schema.main([str(doc)]) == 1
    assert settings_schema.TABLE_START in capsys.readouterr().err
    assert doc.read_text() == "# no table here\n"


def test_the_grammar_backend_choices_are_those_sglang_accepts():
    """settings.json offers the option's choices; host/sglang_0_5_11 holds what 0.5.11's
    --grammar-backend accepts (and what the probe checks): an offered choice SGLang refuses would
    pass validate and fail at start."""
    from dflashctl.host import sglang_0_5_11
    offered = settings_schema.load().setting("grammarBackend").entry["choices"]
    assert set(offered) <= set(sglang_0_5_11.GRAMMAR_BACKEND_CHOICES), offered
