"""Escaping and refusing unit values: Python's unit_text and nix/lib/unit-text.nix over hostile values.

The golden file (tests/data/service/unit-text.json) holds, for each hostile value, what each rule
makes of it; both implementations must give exactly that. tests/regenerate rewrites it from
Python (read the diff: it is the specification).
"""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import nix_or_skip, update_golden
from hostile_values import HOSTILE
from dflashctl.service import unit_text

HERE = Path(__file__).parent.parent
GOLDEN = HERE / "data" / "service" / "unit-text.json"
NIX = HERE / "data" / "service" / "unit-text.nix"


def python_rules(v: str) -> dict:
    rules = unit_text.unit_data()["cacheDir"]
    problem = unit_text.cache_dir_problem(v, rules)

    def directives(static_user: bool):
        if problem is not None:
            return None
        try:
            return unit_text.cache_dir_directives(v, rules, static_user)
        except ValueError:
            return None

    return {
        "specifiers": unit_text.specifiers(v),
        "execArg": unit_text.exec_arg(v),
        "pathWord": unit_text.path_word(v),
        "controlProblem": unit_text.control_problem(v),
        "execPathProblem": unit_text.exec_path_problem(v),
        "execPath": unit_text.exec_path(v) if unit_text.exec_path_problem(v) is None else None,
        "cacheDirProblem": problem,
        "cacheDynamic": directives(False),
        "cacheStatic": directives(True),
        "tmpfiles": unit_text.tmpfiles_line(v, rules, "dflash", "dflash"),
        "unitPathProblem": unit_text.unit_path_problem(v),
    }


def golden() -> list[dict]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.golden
def test_python_matches_the_golden_file():
    got = [{"value": v, **python_rules(v)} for v in HOSTILE]
    update_golden(GOLDEN, json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == golden()


@pytest.mark.nix
def test_nix_matches_the_golden_file(tmp_path):
    nix_or_skip()
    values = tmp_path / "values.json"
    values.write_text(json.dumps(HOSTILE))
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", str(NIX),
                        "--argstr", "valuesFile", str(values)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    want = [{k: v for k, v in g.items() if k != "value"} for g in golden()]
    for value, got, expected in zip(HOSTILE, json.loads(r.stdout), want):
        assert got == expected, f"nix and the golden file differ for {value!r}"


def test_the_golden_file_says_what_systemd_needs():
    """Spot checks of the rules themselves (systemd.service(5), systemd.syntax(7), tmpfiles.d(5))."""
    g = {e["value"]: e for e in golden()}
    assert g["a\\b"]["execArg"] == '"a\\\\b"'  # systemd C-unescapes inside quotes
    assert g['say "hi"']["execArg"] == '"say \\"hi\\""'
    assert g["$HOME and ${X}"]["execArg"] == '"$$HOME and $${X}"'  # no expansion at exec time
    assert g["50%"]["execArg"] == "50%%" and g["50%"]["specifiers"] == "50%%"
    assert g[";"]["execArg"] == '";"' and g["\\;"]["execArg"] == '"\\\\;"'  # not a separator
    assert g[""]["execArg"] == '""'
    assert g["/srv/hf cache/%h"]["pathWord"] == '"/srv/hf cache/%%h"'
    assert g["/srv/hf cache/%h"]["tmpfiles"] == 'd "/srv/hf cache/%%h" 0700 dflash dflash -'
    for v in ("tab\there", "line\nExecStartPre=+/bin/sh -c 'id'", "cr\rlf", "bell\x07", "del\x7f"):
        assert "control character" in g[v]["controlProblem"], v
    assert g["line\nExecStartPre=+/bin/sh -c 'id'"]["controlProblem"].startswith(
        "contains the control character U+000A")
    for v in ("/opt/my'dflash", "/opt/$x/dflashctl", '/opt/"q"', "/opt/a\\b", "relative/hf"):
        assert g[v]["execPathProblem"], v
    assert g["/opt/my dflash/bin/dflashctl"]["execPath"] == '"/opt/my dflash/bin/dflashctl"'


def test_cache_dir_rules_in_the_golden_file():
    g = {e["value"]: e for e in golden()}
    assert g["/var/cache/hf"]["cacheDynamic"] == {"CacheDirectory": "hf", "CacheDirectoryMode": "0700"}
    assert g["/var/cache/hf/"]["cacheDynamic"] == {"CacheDirectory": "hf", "CacheDirectoryMode": "0700"}
    assert g["/var/lib/models/qwen"]["cacheStatic"] == {"StateDirectory": "models/qwen",
                                                        "StateDirectoryMode": "0700"}
    assert g["/srv/hf"]["cacheDynamic"] is None  # needs a static user
    assert g["/srv/hf"]["cacheStatic"] == {"ReadWritePaths": "/srv/hf"}
    for v, by in (("/home/me/hf", "ProtectHome=true"), ("/home", "ProtectHome=true"),
                  ("/root/hf", "ProtectHome=true"), ("/run/user/1000/hf", "ProtectHome=true"),
                  ("/tmp/hf", "PrivateTmp=true"), ("/var/tmp", "PrivateTmp=true")):
        assert f"hidden from the service by {by}" in g[v]["cacheDirProblem"], v
    for v in ("/homework/hf", "/var/tmpx/hf", "/run/hf"):
        assert g[v]["cacheDirProblem"] is None, v
    for v in ("/var/cache/hf cache", "/var/cache/%h", "/var/cache/.hidden", "/var/cache/",
              "/var/lib/x:y"):
        assert "plain names only" in g[v]["cacheDirProblem"], v
    for v in ("relative/hf", "/srv/../etc", "/srv/./hf", "/srv//hf"):
        assert "absolute path without" in g[v]["cacheDirProblem"], v


def test_unit_path_rule_in_the_golden_file():
    """What a unit may reference (issue 34): absolute, normalised, outside what the sandbox hides."""
    g = {e["value"]: e for e in golden()}
    for v, by in (("/home/me/hf", "ProtectHome=true"), ("/root/hf", "ProtectHome=true"),
                  ("/run/user/1000/hf", "ProtectHome=true"), ("/tmp/hf", "PrivateTmp=true"),
                  ("/var/tmp", "PrivateTmp=true")):
        assert g[v]["unitPathProblem"] == f"{v} is hidden from the service by {by}", v
    for v in ("/homework/hf", "/var/tmpx/hf", "/run/hf", "/opt/dflash/bin/dflashctl", "/srv/hf cache/%h"):
        assert g[v]["unitPathProblem"] is None, v
    for v in ("relative/hf", "plain", "/srv/../etc", "/srv/./hf", "/srv//hf"):
        assert "must be an absolute path without" in g[v]["unitPathProblem"], v


@pytest.mark.nix
def test_the_modules_exec_assertions_use_the_same_rule(tmp_path):
    """service-unit.nix's and router-unit.nix's execAssertions (what the module adds for ExecStart)
    refuse exactly what unit_path_problem refuses, with its text."""
    nix_or_skip()
    lib = Path(__file__).resolve().parent.parent.parent / "nix" / "lib"
    paths = {"dflashctl": "/home/me/bin/dflashctl", "python": "/nix/store/abc-env/bin/python",
             "settingsFile": "/tmp/x.json"}
    attrs = " ".join(f'{k} = "{v}";' for k, v in paths.items())
    expr = (f"{{ instance = (import {lib}/service-unit.nix).execAssertions \"a\" {{ {attrs} }}; "
            f"router = (import {lib}/router-unit.nix).execAssertions {{ {attrs} }}; }}")
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", "--expr", expr],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for key, where in (("instance", "services.dflash.instances.a (ExecStart)"),
                       ("router", "services.dflash.router (ExecStart)")):
        failed = sorted(a["message"] for a in got[key] if not a["assertion"])
        want = sorted(f"{where}: {k}: {unit_text.unit_path_problem(v)}" for k, v in paths.items()
                      if unit_text.unit_path_problem(v))
        assert failed == want and len(want) == 2, (key, failed)
