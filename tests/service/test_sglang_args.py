"""Golden tests: instance settings -> SGLang argv and environment (tests/data/service/argv/*.json).

Regenerate after an intended change with tests/regenerate and review the diff.
"""

import json
from pathlib import Path

import pytest
from conftest import update_golden

from dflashctl.service import config, sglang_args

GOLDEN = Path(__file__).parent.parent / "data" / "service" / "argv"
CASES = sorted(p.stem for p in GOLDEN.glob("*.json"))
PYTHON = "/nix/store/00000000000000000000000000000000-dflash-env/bin/python"


def render(settings: dict) -> dict:
    cfg = config.from_dict(settings)
    base = {"PATH": "/usr/bin", "CACHE_DIRECTORY": "/var/cache/dflash-x"}
    env = sglang_args.build_env(cfg, base)
    return {"argv": sglang_args.build_argv(cfg, PYTHON),
            "env": {k: v for k, v in sorted(env.items()) if base.get(k) != v}}


@pytest.mark.golden
@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    path = GOLDEN / f"{case}.json"
    data = json.loads(path.read_text())
    got = render(data["settings"])
    update_golden(path, json.dumps({"settings": data["settings"], **got}, indent=2) + "\n")
    assert {"argv": data.get("argv"), "env": data.get("env")} == got


def test_cases_cover_every_algorithm():
    algos = {json.loads((GOLDEN / f"{c}.json").read_text())["settings"].get("speculative", {}).get("algorithm")
             for c in CASES}
    assert algos >= {"DFLASH", "DDTREE", "EAGLE3", None}


def test_every_mapped_flag_appears_in_some_golden_argv():
    seen = set()
    for c in CASES:
        seen |= {a for a in json.loads((GOLDEN / f"{c}.json").read_text())["argv"] if a.startswith("--")}
    aliases = {"--tp", "--speculative-dflash-block-size"}  # refused in extraArgs, never emitted
    assert set(sglang_args.MAPPED_FLAGS) - aliases <= seen


def test_api_key_is_never_in_argv_unless_given():
    cfg = config.from_dict({"name": "a", "model": "m", "apiKeyFile": "/k"})
    assert "secret" not in sglang_args.build_argv(cfg, "py")
    argv = sglang_args.build_argv(cfg, "py", api_key="secret")
    assert argv[argv.index("--api-key") + 1] == "secret"


def test_environment_overrides_and_cache():
    cfg = config.from_dict({"name": "a", "model": "m", "environment": {"HF_HOME": "/data/hf"}})
    assert sglang_args.build_env(cfg, {"CACHE_DIRECTORY": "/var/cache/x"})["HF_HOME"] == "/data/hf"
    cfg = config.from_dict({"name": "a", "model": "m"})
    assert "HF_HOME" not in sglang_args.build_env(cfg, {})
    assert "CUDA_VISIBLE_DEVICES" not in sglang_args.build_env(cfg, {})  # gpus empty: all visible


def test_defaults():
    cfg = config.from_dict({"name": "a", "model": "m"})
    assert (cfg.host, cfg.port, cfg.grammar_backend, cfg.start_timeout_sec, cfg.tp_size) == \
        ("127.0.0.1", 30000, "xgrammar", 900, 1)
    assert cfg.base_url == "http://127.0.0.1:30000"
    assert config.from_dict({"name": "a", "model": "m", "host": "0.0.0.0"}).base_url == "http://127.0.0.1:30000"
    assert config.from_dict({"name": "a", "model": "m", "host": "::"}).base_url == "http://[::1]:30000"


def test_load_takes_name_from_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"name": "gpu0", "model": "m", "gpus": [0]}))
    cfg = config.load(f)
    assert cfg.name == "gpu0" and cfg.gpus == (0,)
