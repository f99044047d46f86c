"""nix/module.nix inside a faithful, reduced NixOS (tests/nixos/, driven by module_harness.py).

Valid configurations: each unit NixOS would write is compared directive by directive with
`dflashctl unit`'s, goes through `systemd-analyze verify` and `security`, and its settings pass the
build-time check. Invalid ones: each is refused at evaluation (an option type or an assertion) or by
the check, with its message. Needs nixpkgs' lib (module_harness.nixpkgs_lib: DFLASH_NIXPKGS_LIB or
../shared/nixpkgs-lib); skipped, saying so, where there is none.
"""

import dataclasses
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import module_harness as mh
from conftest import nix_or_skip
from dflashctl.service import config, unit, validate

pytestmark = pytest.mark.nix
MAX_EXPOSURE = 1.6


@pytest.fixture(autouse=True)
def _nixpkgs_lib():
    nix_or_skip()
    if mh.nixpkgs_lib() is None:
        pytest.skip("no nixpkgs lib: set DFLASH_NIXPKGS_LIB, or put nix-community/nixpkgs.lib at "
                    "../shared/nixpkgs-lib next to the repository")


QWEN = {"model": "Qwen/Qwen3-8B", "gpus": [0]}
DFLASH = {**QWEN, "draftModel": "z-lab/Qwen3-8B-DFlash-b16", "speculative": {"algorithm": "DFLASH"}}
DDTREE = {**DFLASH, "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 64}}
PATCHED = "{ pkgs, ... }: { services.dflash.instances.a.package = pkgs.dflash-env-ddtree; }"

# (id, instances, host module or None, directives only the module adds {key: [values]})
VALID = [
    ("plain", {"a": {"model": "Qwen/Qwen3-8B"}}, None, {}),
    ("dflash", {"a": DFLASH}, None, {}),
    ("eagle3", {"a": {**DFLASH, "speculative": {"algorithm": "EAGLE3", "numDraftTokens": 4}}}, None, {}),
    ("ddtree-patched-sglang", {"a": DDTREE}, PATCHED, {}),
    ("two-instances", {"a": DFLASH, "b": {**QWEN, "gpus": [1], "port": 30001}}, None, {}),
    ("tensor-parallel", {"a": {**QWEN, "gpus": [0, 1], "tpSize": 2}}, None, {}),
    ("shared-gpu", {"a": {**QWEN, "allowSharedGpus": True, "memFractionStatic": 0.4},
                    "b": {**QWEN, "allowSharedGpus": True, "memFractionStatic": 0.4, "port": 30001}},
     None, {}),
    ("api-key", {"a": {**QWEN, "apiKeyFile": "/run/secrets/dflash-key"}}, None, {}),
    ("api-key-percent-space", {"a": {**QWEN, "apiKeyFile": "/run/keys/50% key"}}, None, {}),
    ("model-percent", {"a": {**QWEN, "model": "org/50%-model"}}, None, {}),
    ("model-local-unicode", {"a": {**QWEN, "model": "/srv/modèles/qwen3 8b"}}, None, {}),
    ("cache-var-cache", {"a": {**QWEN, "cacheDir": "/var/cache/hf"}}, None, {}),
    ("cache-var-lib", {"a": {**QWEN, "cacheDir": "/var/lib/models/qwen"}}, None, {}),
    ("grammar-none", {"a": {**QWEN, "grammarBackend": "none"}}, None, {}),
    ("wildcard-host", {"a": {**QWEN, "host": "0.0.0.0", "openFirewall": True}}, None, {}),
    ("wildcard-ipv6", {"a": {**QWEN, "host": "::", "grammarBackend": "none"}}, None, {}),
    ("wildcard-with-key", {"a": {**QWEN, "host": "0.0.0.0", "apiKeyFile": "/run/k"}}, None, {}),
    ("long-start", {"a": {**QWEN, "startTimeoutSec": 3600}}, None, {}),
    ("extra-args-hostile", {"a": {**QWEN, "extraArgs": ["--json-model-override-args",
                                                        '{"a": "$HOME %h \\"q\\" \\\\"}']}}, None, {}),
    ("environment", {"a": {**QWEN, "environment": {"NCCL_DEBUG": "WARN", "X": "$HOME %h 'q'"}}},
     None, {}),
    ("synthetic-smoke", {"a": {**DFLASH, "loadFormat": "dummy", "draftLoadFormat": "dummy",
                               "skipTokenizerInit": True, "cudaGraphMaxBs": 8,
                               "samplingBackend": "pytorch", "disableCudaGraph": True,
                               "enableMetrics": True, "servedModelName": "qwen"}}, None, {}),
    ("disabled-instance", {"a": QWEN, "b": {**QWEN, "enable": False}}, None, {}),
    ("pinned-offline-gated", {"a": {**DFLASH, "modelRevision": "0e9e39f249a16976918f6564b8830bc894c89659",
                                    "draftModelRevision": "main", "hfTokenFile": "/run/secrets/hf token%",
                                    "apiKeyFile": "/run/secrets/k", "offline": True}}, None, {}),
    ("static-new-user", {"a": {**QWEN, "user": "dflash"}}, None,
     {"User": ["dflash"], "DynamicUser": ["false"]}),
    ("static-user-and-group", {"a": {**QWEN, "user": "svc", "group": "gpu"}}, None,
     {"User": ["svc"], "Group": ["gpu"], "DynamicUser": ["false"]}),
    ("static-user-srv-cache", {"a": {**QWEN, "user": "dflash", "cacheDir": "/srv/hf cache/%h"}}, None,
     {"User": ["dflash"], "DynamicUser": ["false"], "ReadWritePaths": ['"/srv/hf cache/%%h"']}),
    ("static-user-shared-cache", {"a": {**QWEN, "user": "dflash", "cacheDir": "/var/cache/hf"},
                                  "b": {**QWEN, "gpus": [1], "port": 30001, "user": "dflash",
                                        "cacheDir": "/var/cache/hf"}}, None,
     {"User": ["dflash"], "DynamicUser": ["false"]}),
    ("existing-normal-user", {"a": {**QWEN, "user": "alice"}},
     "{ users.users.alice = { isNormalUser = true; uid = 1000; }; }",
     {"User": ["alice"], "DynamicUser": ["false"]}),
    ("existing-system-user", {"a": {**QWEN, "user": "svc"}},
     '{ users.users.svc = { isSystemUser = true; group = "gpu"; }; users.groups.gpu = { }; }',
     {"User": ["svc"], "DynamicUser": ["false"]}),
]


def sections(text: str) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    current = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = out.setdefault(line.strip("[]"), Counter())
            continue
        key, value = line.split("=", 1)
        if key == "Environment" and value.startswith('"PATH='):
            continue  # NixOS's PATH from `path` (the host compiler, coreutils...): not a dflash directive
        current[(key, value)] += 1
    return out


def exec_start(text: str) -> list[str]:
    return re.search(r"^ExecStart=(.*)$", text, re.M).group(1).split(" ")


def python_unit(module_text: str, extra: dict) -> str:
    """`dflashctl unit` for the settings file and packages the module's unit runs."""
    argv = exec_start(module_text)
    settings_path, python = argv[3], argv[5]
    cfg = config.load(settings_path)
    if any(k == "ReadWritePaths" for k in extra):
        cfg = dataclasses.replace(cfg, cache_dir=None)  # outside /var/cache: only a static user
    return unit.render(cfg, settings_path, argv[0], python)


def expected_from_python(py: str, extra: dict) -> dict[str, Counter]:
    want = sections(py)
    for key, values in extra.items():
        for k in [k for k in want["Service"] if k[0] == key]:
            del want["Service"][k]
        for v in values:
            want["Service"][(key, v)] += 1
    return want


def verifiable(text: str, path: Path) -> Path:
    """The unit for this host's systemd-analyze: directives newer than it are left out, as
    `dflashctl unit --systemd` would (NixOS ships systemd >= 254, which knows them)."""
    version = unit.systemd_version() or 0
    drop = [k for k, v in unit.unit_data()["minSystemd"].items() if version < v]
    lines = [line for line in text.splitlines() if line.split("=", 1)[0] not in drop]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("instances,host,extra", [(i, h, e) for _, i, h, e in VALID],
                         ids=[n for n, _, _, _ in VALID])
def test_valid_configuration(tmp_path, instances, host, extra):
    out = mh.evaluate(instances, host)
    enabled = [n for n, i in instances.items() if i.get("enable", True)]
    assert sorted(out["units"]) == sorted(f"dflash-{n}.service" for n in enabled)
    for name in enabled:
        text = out["units"][f"dflash-{name}.service"]
        # directive by directive, the unit `dflashctl unit` renders (plus module-only ones)
        assert sections(text) == expected_from_python(python_unit(text, extra), extra), name
        assert out["wantedBy"][f"dflash-{name}.service"] == ["multi-user.target"]
        if "user" not in instances[name]:
            assert "\nUser=" not in text and "\nDynamicUser=true\n" in text
        if shutil.which("systemd-analyze"):
            path = verifiable(text, tmp_path / f"dflash-{name}.service")
            r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
            assert r.returncode == 0 and "Unknown key" not in r.stderr, r.stderr
            r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                               capture_output=True, text=True)
            score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout).group(1))
            assert score <= MAX_EXPOSURE, r.stdout
    # the settings check passes, and NixOS warns exactly as `dflashctl validate` does
    settings_check = out["checks"][0]
    assert settings_check["name"] == "dflash-validate-settings"
    r = mh.run_check(settings_check)
    assert r.returncode == 0, r.stderr
    all_settings = re.search(r"validate (\S+)", settings_check["script"]).group(1)
    errors, warnings, _ = validate.check(json.loads(Path(all_settings).read_text()))
    assert errors == [] and sorted(out["warnings"]) == sorted(warnings)
    for check in out["checks"][1:]:
        assert mh.run_check(check).returncode == 0, check["name"]


# (id, instances, host, where: eval | assert | check, message)
INJECT = "\nExecStartPre=+/bin/sh -c 'id > /root/pwned'"
INVALID = [
    ("model-newline", {"a": {**QWEN, "model": "m\n[Service]" + INJECT}}, None, "eval",
     "services.dflash.instances.a.model' is not of type `string without newlines or other control"),
    ("cache-dir-newline", {"a": {**QWEN, "cacheDir": "/var/cache/hf" + INJECT}}, None, "eval",
     "services.dflash.instances.a.cacheDir' is not of type"),
    ("api-key-newline", {"a": {**QWEN, "apiKeyFile": "/run/k" + INJECT}}, None, "eval",
     "services.dflash.instances.a.apiKeyFile' is not of type"),
    ("extra-args-tab", {"a": {**QWEN, "extraArgs": ["--x", "a\tb"]}}, None, "eval",
     "services.dflash.instances.a.extraArgs"),
    ("environment-newline", {"a": {**QWEN, "environment": {"X": "1\nY=2"}}}, None, "eval",
     "services.dflash.instances.a.environment.X' is not of type"),
    ("host-control", {"a": {**QWEN, "host": "0.0.0.0\x1b"}}, None, "eval",
     "services.dflash.instances.a.host' is not of type"),
    ("user-with-space", {"a": {**QWEN, "user": "my user"}}, None, "eval",
     "services.dflash.instances.a.user' is not of type"),
    ("port-out-of-range", {"a": {**QWEN, "port": 70000}}, None, "eval",
     "services.dflash.instances.a.port' is not of type"),
    ("grammar-unknown", {"a": {**QWEN, "grammarBackend": "fast"}}, None, "eval",
     "services.dflash.instances.a.grammarBackend' is not of type"),
    ("typo", {"a": {**QWEN, "prot": 1}}, None, "eval",
     "The option `services.dflash.instances.a.prot' does not exist"),
    ("hf-token-in-store", {"a": {**QWEN, "hfTokenFile": "/nix/store/abc-token"}}, None, "assert",
     "hfTokenFile points into the Nix store"),
    ("hf-token-newline", {"a": {**QWEN, "hfTokenFile": "/run/t" + INJECT}}, None, "eval",
     "hfTokenFile"),
    ("revision-on-local-model", {"a": {**QWEN, "model": "/srv/m", "modelRevision": "main"}}, None, "check",
     "is a local directory, which has no hub revision"),
    ("api-key-in-store", {"a": {**QWEN, "apiKeyFile": "/nix/store/abc-key"}}, None, "assert",
     "services.dflash.instances.a.apiKeyFile points into the Nix store"),
    ("cache-needs-static-user", {"a": {**QWEN, "cacheDir": "/srv/hf"}}, None, "assert",
     "services.dflash.instances.a.cacheDir: /srv/hf is outside /var/cache and /var/lib"),
    ("cache-in-home", {"a": {**QWEN, "user": "dflash", "cacheDir": "/home/dflash/hf"}}, None, "assert",
     "services.dflash.instances.a.cacheDir: /home/dflash/hf is hidden from the service by ProtectHome=true"),
    ("cache-in-tmp", {"a": {**QWEN, "cacheDir": "/tmp/hf"}}, None, "assert",
     "hidden from the service by PrivateTmp=true"),
    ("cache-unplain-name", {"a": {**QWEN, "cacheDir": "/var/cache/hf cache"}}, None, "assert",
     "which takes plain names only"),
    ("cache-dot-dot", {"a": {**QWEN, "cacheDir": "/var/cache/../../etc"}}, None, "assert",
     "must be an absolute path without '.', '..' or '//' components"),
    ("cache-shared-dynamic", {"a": {**QWEN, "cacheDir": "/var/cache/hf"},
                              "b": {**QWEN, "gpus": [1], "port": 30001, "cacheDir": "/var/cache/hf"}},
     None, "assert", "/var/cache/hf is shared by DynamicUser instances"),
    ("user-root", {"a": {**QWEN, "user": "root"}}, None, "assert", 'user = "root" would run SGLang'),
    ("name-with-dot", {"a.b": QWEN}, None, "assert", "the instance name must be 1-64 letters"),
    ("normal-user-low-uid", {"a": {**QWEN, "user": "bob"}},
     "{ users.users.bob = { isNormalUser = true; uid = 500; }; }", "assert",
     "A user cannot have a users.users.bob.uid set below 1000"),
    ("port-clash", {"a": QWEN, "b": {**QWEN, "gpus": [1]}}, None, "check",
     "instances 'a' and 'b': both use port 30000"),
    ("gpu-clash", {"a": QWEN, "b": {**QWEN, "port": 30001}}, None, "check", "both use GPU 0"),
    ("dflash-without-draft", {"a": {**QWEN, "speculative": {"algorithm": "DFLASH"}}}, None, "check",
     "speculative.algorithm: DFLASH needs draftModel"),
    ("tp-larger-than-gpus", {"a": {**QWEN, "tpSize": 2}}, None, "check",
     "tpSize: 2 is larger than the 1 GPU(s)"),
    ("extra-args-mapped-flag", {"a": {**QWEN, "extraArgs": ["--port", "1"]}}, None, "check",
     "extraArgs: --port is set by the option port"),
    ("cuda-visible-devices", {"a": {**QWEN, "environment": {"CUDA_VISIBLE_DEVICES": "1"}}}, None,
     "check", "environment.CUDA_VISIBLE_DEVICES: conflicts with gpus"),
    ("environment-bad-name", {"a": {**QWEN, "environment": {"1X": "a"}}}, None, "check",
     "keys are variable names ('1X' is not)"),
    ("port-above-grpc-limit", {"a": {**QWEN, "port": 60000}}, None, "check",
     "port: 60000 is above 55535"),
    ("gpu-repeated", {"a": {**QWEN, "gpus": [0, 0]}}, None, "check",
     "gpus: must be a list without repeats (got [0, 0])"),
    ("ddtree-release-sglang", {"a": DDTREE}, None, "check",
     "speculative.algorithm DDTREE is not offered by the package's SGLang"),
]


@pytest.mark.parametrize("instances,host,where,message", [(i, h, w, m) for _, i, h, w, m in INVALID],
                         ids=[n for n, *_ in INVALID])
def test_invalid_configuration(instances, host, where, message):
    if where == "eval":
        with pytest.raises(mh.EvalError) as e:
            mh.evaluate(instances, host)
        assert message in str(e.value)
    elif where == "assert":
        with pytest.raises(mh.AssertionsFailed) as e:
            mh.evaluate(instances, host)
        assert any(message in m for m in e.value.messages), e.value.messages
    else:
        out = mh.evaluate(instances, host)
        failed = [(c["name"], r) for c in out["checks"] if (r := mh.run_check(c)).returncode != 0]
        assert failed, "every check passed"
        assert any(message in r.stderr for _, r in failed), [r.stderr for _, r in failed]


def test_there_are_at_least_40_configurations():
    assert len(VALID) + len(INVALID) >= 40
    assert len({n for n, *_ in VALID + INVALID}) == len(VALID) + len(INVALID)


def test_injection_never_reaches_a_unit():
    """Issue 9 #1: a newline in model named `description`, or reached the unit (cacheDir)."""
    with pytest.raises(mh.EvalError) as e:
        mh.evaluate({"a": {**QWEN, "model": "m\n[Service]" + INJECT}})
    assert "instances.a.model'" in str(e.value) and ".description'" not in str(e.value)


# --- host overrides (issue 9 #6) ---------------------------------------------------------------------

def _override(key: str, value):
    """Another valid value for a directive, as the Nix a host would write."""
    special = {"Type": '"exec"', "Restart": '"always"', "KillMode": '"control-group"',
               "NotifyAccess": '"all"', "DevicePolicy": '"strict"', "ProtectSystem": '"full"',
               "ProtectProc": '"noaccess"', "ProcSubset": '"pid"'}
    if key in special:
        return special[key]
    if isinstance(value, bool):
        return "false" if value else "true"
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, list):
        return '[ "host-' + key + '" ]'
    return '"host-' + key + '"'


def test_every_unit_default_yields_to_the_host():
    data = unit.unit_data()
    service = {**data["service"], "ExecStart": "/bin/x", "TimeoutStartSec": "1s", "LoadCredential": "x"}
    unit_keys = {k: v for k, v in data["unit"].items() if k not in ("After", "Wants")}
    host = ("{ systemd.services.dflash-a = {\n  description = \"host description\";\n"
            "  serviceConfig = {\n"
            + "".join(f"    {k} = {_override(k, v)};\n" for k, v in service.items())
            + "  };\n  unitConfig = {\n"
            + "".join(f"    {k} = {_override(k, v)};\n" for k, v in unit_keys.items())
            + "  };\n}; }")
    out = mh.evaluate({"a": {**QWEN, "apiKeyFile": "/run/k"}}, host)
    got = sections(out["units"]["dflash-a.service"])
    for key, value in service.items():
        want = _override(key, value).strip('"[] ')
        assert [v for k, v in got["Service"] if k == key] == [want], key
    for key, value in unit_keys.items():
        assert [v for k, v in got["Unit"] if k == key] == [_override(key, value).strip('"')], key
    assert ("Description", "host description") in got["Unit"]


def test_start_limit_burst_from_the_host():
    """`systemd.services.dflash-a.startLimitBurst = 10` was a conflicting definition."""
    out = mh.evaluate({"a": QWEN}, "{ systemd.services.dflash-a.startLimitBurst = 10; }")
    got = sections(out["units"]["dflash-a.service"])["Unit"]
    assert [v for k, v in got if k == "StartLimitBurst"] == ["10"]


def test_host_dependencies_add_to_the_modules():
    out = mh.evaluate({"a": QWEN}, '{ systemd.services.dflash-a.after = [ "nvidia-persistenced.service" ]; }')
    got = sections(out["units"]["dflash-a.service"])["Unit"]
    assert ("After", "network-online.target nvidia-persistenced.service") in got


# --- users (issue 9 #7) ------------------------------------------------------------------------------

def test_users():
    out = mh.evaluate({"a": {**QWEN, "user": "dflash"}, "b": {**QWEN, "gpus": [1], "port": 30001}})
    assert out["users"]["dflash"]["isSystemUser"] and out["users"]["dflash"]["group"] == "dflash"
    assert "dflash" in out["groups"]
    a, b = out["units"]["dflash-a.service"], out["units"]["dflash-b.service"]
    assert "\nUser=dflash\n" in a and "\nDynamicUser=false\n" in a and "\nGroup=" not in a
    assert "\nUser=" not in b and "\nGroup=" not in b and "\nDynamicUser=true\n" in b


def test_an_existing_normal_user_is_used_as_it_is():
    out = mh.evaluate({"a": {**QWEN, "user": "alice"}}, "{ users.users.alice.isNormalUser = true; }")
    assert out["users"]["alice"]["isNormalUser"] and not out["users"]["alice"]["isSystemUser"]
    assert out["users"]["alice"]["group"] == "users"


def test_static_user_cache_dir_is_created_for_it():
    out = mh.evaluate({"a": {**QWEN, "user": "dflash", "cacheDir": "/srv/hf cache/%h"}})
    assert out["tmpfiles"] == ['d "/srv/hf cache/%%h" 0700 dflash dflash -']
    out = mh.evaluate({"a": {**QWEN, "user": "alice", "cacheDir": "/srv/hf"}},
                      "{ users.users.alice.isNormalUser = true; }")
    assert out["tmpfiles"] == ["d /srv/hf 0700 alice users -"]


# --- two-step validation and warnings (issue 9 #8, #9) -----------------------------------------------

def test_settings_check_needs_no_stack():
    out = mh.evaluate({"a": DFLASH, "b": {**QWEN, "gpus": [1], "port": 30001}})
    assert [c["name"] for c in out["checks"]] == ["dflash-validate-settings"]
    assert "env-release" not in out["checks"][0]["script"]  # the 3.6 GiB stack is not an input


def test_only_ddtree_instances_are_checked_against_their_package():
    out = mh.evaluate({"a": DDTREE, "b": {**DFLASH, "gpus": [1], "port": 30001}}, PATCHED)
    names = [c["name"] for c in out["checks"]]
    assert names == ["dflash-validate-settings", "dflash-validate-a-package"]
    assert "env-ddtree/bin/python" in out["checks"][1]["script"]


def test_warnings_are_nixos_warnings():
    out = mh.evaluate({"a": {**QWEN, "grammarBackend": "none", "host": "0.0.0.0"}})
    assert len(out["warnings"]) == 3
    assert any("Qwen/Qwen3-8B has no modelRevision" in w for w in out["warnings"])
    assert any('grammarBackend is "none"' in w for w in out["warnings"])
    assert any("listens on every interface (0.0.0.0) without apiKeyFile" in w for w in out["warnings"])


# --- the flake's module -------------------------------------------------------------------------------

def test_flake_module_defaults_to_the_flakes_packages():
    out = mh.evaluate({"a": DFLASH}, flake=True)
    argv = exec_start(out["units"]["dflash-a.service"])
    assert argv[0].endswith("/dflashctl/bin/dflashctl") and argv[5].endswith("/env-release/bin/python")
    # SGLang's JIT compiles with the flake's pinned host compiler, the one its smoke app uses
    assert "-flake-gcc-wrapper-14/bin" in out["units"]["dflash-a.service"]


def test_units_put_the_pinned_host_compiler_on_path():
    unit_text = mh.evaluate({"a": QWEN})["units"]["dflash-a.service"]
    path = next(line for line in unit_text.splitlines() if line.startswith('Environment="PATH='))
    assert path.startswith('Environment="PATH=/nix/store/00000000000000000000000000000000-gcc-wrapper-14/bin:')


def test_module_only_options_are_documented_in_service_md(repo):
    doc = (repo / "docs" / "service.md").read_text()
    for option in ("user", "group", "openFirewall", "package", "enable"):
        assert f"`{option}`" in doc, option
