"""The NixOS module's units, refusals and warnings, proven without nixpkgs.

nix/lib/service-unit.nix decides everything the module hands to NixOS for an instance; here it
is evaluated with plain Nix (tests/nix_unit.py) over many configurations and the hostile values of
tests/service/test_unit_text.py, and compared with dflashctl's own rendering:
- every valid configuration: each unit directive by directive with `dflashctl unit`'s (plus the
  directives only the module adds, for a static user), the settings file read back by dflashctl as
  the same configuration, the warnings `dflashctl validate` prints, `systemd-analyze verify` and
  `security` on the unit;
- every refused value: refused by both, with the same reason. Control characters and unusable
  cache directories are refused by the Nix functions themselves (NixOS assertions); a value only
  an option type refuses (an empty model, a relative path) reaches the settings file, which the
  module's build-time check (`dflashctl validate`) refuses.
What needs NixOS itself (option types, a host's overrides, existing users) is tier 2: nix/checks.nix.
"""

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import nix_unit
from nixeval import eval_json
from conftest import REPO, nix_or_skip
from dflashctl.errors import DflashError
from dflashctl.service import config, unit, unit_text, validate
from hostile_values import HOSTILE

pytestmark = pytest.mark.nix
MAX_EXPOSURE = 1.6
OPT = "services.dflash.instances"

QWEN = {"model": "Qwen/Qwen3-8B", "gpus": [0]}
DFLASH = {**QWEN, "draftModel": "z-lab/Qwen3-8B-DFlash-b16", "speculative": {"algorithm": "DFLASH"}}
PINNED = {"modelRevision": "0e9e39f249a16976918f6564b8830bc894c89659"}

# (id, instances) as a host writes services.dflash.instances; every one is valid.
HAND_WRITTEN = [
    ("plain", {"a": {"model": "Qwen/Qwen3-8B"}}),
    ("dflash", {"a": DFLASH}),
    ("eagle3", {"a": {**DFLASH, "speculative": {"algorithm": "EAGLE3", "numDraftTokens": 4}}}),
    ("ddtree", {"a": {**DFLASH, "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 64}}}),
    ("two-instances", {"a": DFLASH, "b": {**QWEN, "gpus": [1], "port": 30001}}),
    ("tensor-parallel", {"a": {**QWEN, "gpus": [0, 1], "tpSize": 2}}),
    ("shared-gpu", {"a": {**QWEN, "allowSharedGpus": True, "memFractionStatic": 0.4},
                    "b": {**QWEN, "allowSharedGpus": True, "memFractionStatic": 0.4, "port": 30001}}),
    ("api-key", {"a": {**QWEN, "apiKeyFile": "/run/secrets/dflash-key"}}),
    ("api-key-percent-space", {"a": {**QWEN, "apiKeyFile": "/run/keys/50% key"}}),
    ("model-percent", {"a": {**QWEN, "model": "org/50%-model"}}),
    ("model-local-unicode", {"a": {**QWEN, "model": "/srv/modèles/qwen3 8b"}}),
    ("cache-var-cache", {"a": {**QWEN, "cacheDir": "/var/cache/hf"}}),
    ("cache-var-lib", {"a": {**QWEN, "cacheDir": "/var/lib/models/qwen"}}),
    ("grammar-none", {"a": {**QWEN, "grammarBackend": "none"}}),
    ("wildcard-host", {"a": {**QWEN, "host": "0.0.0.0"}}),
    ("wildcard-ipv6", {"a": {**QWEN, "host": "::", "grammarBackend": "none"}}),
    ("wildcard-with-key", {"a": {**QWEN, "host": "0.0.0.0", "apiKeyFile": "/run/k"}}),
    ("long-start", {"a": {**QWEN, "startTimeoutSec": 3600}}),
    ("extra-args-hostile", {"a": {**QWEN, "extraArgs": ["--json-model-override-args",
                                                        '{"a": "$HOME %h \\"q\\" \\\\"}']}}),
    ("environment", {"a": {**QWEN, "environment": {"NCCL_DEBUG": "WARN", "X": "$HOME %h 'q'"}}}),
    ("synthetic-smoke", {"a": {**DFLASH, "loadFormat": "dummy", "draftLoadFormat": "dummy",
                               "skipTokenizerInit": True, "cudaGraphMaxBs": 8,
                               "samplingBackend": "pytorch", "disableCudaGraph": True,
                               "enableMetrics": True, "servedModelName": "qwen"}}),
    ("pinned-offline-gated", {"a": {**DFLASH, **PINNED, "draftModelRevision": "main",
                                    "hfTokenFile": "/run/secrets/hf token%",
                                    "apiKeyFile": "/run/secrets/k", "offline": True}}),
    ("static-new-user", {"a": {**QWEN, "user": "dflash"}}),
    ("static-user-and-group", {"a": {**QWEN, "user": "svc", "group": "gpu"}}),
    ("static-user-srv-cache", {"a": {**QWEN, "user": "dflash", "cacheDir": "/srv/hf cache/%h"}}),
    ("static-user-shared-cache", {"a": {**QWEN, "user": "dflash", "cacheDir": "/var/cache/hf"},
                                  "b": {**QWEN, "gpus": [1], "port": 30001, "user": "dflash",
                                        "cacheDir": "/var/cache/hf"}}),
    ("driver-dir", {"a": {**QWEN, "driverLibraryDir": "/usr/lib/x86_64-linux-gnu"}}),
    ("stall-off", {"a": {**QWEN, "stallTimeoutSec": 0, "contextLength": 32768}}),
    ("json-whitespace", {"a": {**QWEN, "constrainedJsonDisableAnyWhitespace": True,
                               "attentionBackend": "fa3"}}),
]


def _combinations() -> list[tuple[str, dict]]:
    """Algorithms x cache directories x credentials x users: the directives that depend on them."""
    algorithms = {"none": QWEN, "dflash": DFLASH,
                  "ddtree": {**DFLASH, "speculative": {"algorithm": "DDTREE", "numDraftTokens": 8}}}
    caches = {"default": {}, "var-cache": {"cacheDir": "/var/cache/models"},
              "var-lib": {"cacheDir": "/var/lib/dflash/hf"}}
    secrets = {"nokey": {}, "key": {"apiKeyFile": "/run/secrets/key"},
               "token": {"hfTokenFile": "/run/secrets/hf"},
               "both": {"apiKeyFile": "/etc/dflash/k%d", "hfTokenFile": "/etc/dflash/t"}}
    users = {"dynamic": {}, "static": {"user": "dflash"}}
    out = []
    for a, base in algorithms.items():
        for c, cache in caches.items():
            for s, secret in secrets.items():
                user = users["static" if (len(out) % 3 == 0) else "dynamic"]
                name = f"{a}-{c}-{s}-{'static' if user else 'dynamic'}"
                out.append((name, {"a": {**base, **PINNED, **cache, **secret, **user}}))
    return out


VALID = HAND_WRITTEN + _combinations()


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
        current[(key, value)] += 1
    return out


def split_digest(unit_sections: dict[str, Counter]) -> tuple[dict[str, Counter], str]:
    """The unit without its DFLASH_UNIT_DIGEST line, and the digest (exactly one per unit)."""
    service = Counter(unit_sections["Service"])
    lines = [k for k in service if k[0] == "Environment" and k[1].startswith("DFLASH_UNIT_DIGEST=")]
    assert len(lines) == 1 and service[lines[0]] == 1, lines
    del service[lines[0]]
    return {**unit_sections, "Service": service}, lines[0][1].split("=", 1)[1]


def python_unit(name: str, options: dict, paths: dict) -> dict[str, Counter]:
    """`dflashctl unit` for the same settings, plus what the module adds for a static user."""
    cfg = config.from_dict({k: v for k, v in options.items() if k not in nix_unit.MODULE_ONLY}, name)
    user, group = options.get("user"), options.get("group")
    outside = cfg.cache_dir is not None and not any(
        cfg.cache_dir.startswith(p) for p in unit.unit_data()["cacheDir"]["systemdOwned"])
    if user and outside:  # only a static user can own it; `dflashctl unit` is DynamicUser only
        render_cfg = config.from_dict({**config.to_dict(cfg), "cacheDir": None})
    else:
        render_cfg = cfg
    want = sections(unit.render(render_cfg, f"/etc/dflash/{name}.json", paths["dflashctl"],
                                paths["python"]))
    service = want["Service"]
    if user:
        extra = {"DynamicUser": "false", "User": user, **({"Group": group} if group else {})}
        if outside:
            extra["ReadWritePaths"] = unit_text.path_word(cfg.cache_dir)
        for key, value in extra.items():
            for k in [k for k in service if k[0] == key]:
                del service[k]
            service[(key, value)] += 1
    return want


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict:
    """Real executables for ExecStart: systemd-analyze verify checks that they exist."""
    root = tmp_path_factory.mktemp("unit-nix")
    out = {}
    for key, rel in (("dflashctl", "dflashctl/bin/dflashctl"), ("python", "env/bin/python")):
        exe = root / rel
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
        out[key] = str(exe)
    return out


@pytest.fixture(scope="module")
def valid_results(paths):
    nix_or_skip()
    cases = [{"instances": {n: nix_unit.full_options(n, o) for n, o in instances.items()}, **paths}
             for _, instances in VALID]
    results, _ = nix_unit.evaluate_many(cases)
    return dict(zip([n for n, _ in VALID], results))


def test_there_are_at_least_60_configurations():
    assert len(VALID) >= 60
    assert len({n for n, _ in VALID}) == len(VALID)


@pytest.mark.parametrize("case", [n for n, _ in VALID])
def test_unit_equals_dflashctl_unit(case, valid_results, paths):
    instances = dict(VALID)[case]
    result = valid_results[case]
    assert result["failedAssertions"] == []
    for name, options in instances.items():
        got = result["units"][name]
        nix_sections, nix_digest = split_digest(sections(got["text"]))
        python_sections, python_digest = split_digest(python_unit(name, options, paths))
        assert nix_sections == python_sections, name
        # Both renderers hash with one function: the module's digest is dflashctl's over the unit
        # as NixOS writes it (its settings file is a store path: no settings of their own).
        w = got["written"]
        service = {**w["Service"], "Environment": [e for e in w["Service"]["Environment"]
                                                   if not e.startswith("DFLASH_UNIT_DIGEST=")]}
        assert nix_digest == unit.definition_digest({**w, "Service": service}), name
        assert python_digest != nix_digest  # dflashctl's covers the settings file's content too
        # the settings file is read back by dflashctl as the configuration that was written
        settings = config.from_dict(got["settings"])
        assert settings == config.from_dict(
            {k: v for k, v in options.items() if k not in nix_unit.MODULE_ONLY}, name)
        if options.get("user") is None:
            assert "\nUser=" not in got["text"] and "\nDynamicUser=true\n" in got["text"]
    cfgs = [config.from_dict(u["settings"]) for u in result["units"].values()]
    assert sorted(result["warnings"]) == sorted(w for c in cfgs for w in validate.warnings_for(c))
    errors, _, _ = validate.check({"instances": {n: u["settings"] for n, u in result["units"].items()}})
    assert errors == []  # the module's build-time check passes


def _verify(paths_: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", *map(str, paths_)], capture_output=True,
                          text=True, timeout=120)


def _for_this_systemd(text: str) -> str:
    """Directives newer than this host's systemd-analyze left out, as `dflashctl unit --systemd`
    would (NixOS ships a systemd that knows them)."""
    version = unit.systemd_version() or 0
    drop = [k for k, v in unit.unit_data()["minSystemd"].items() if version < v]
    return "\n".join(line for line in text.splitlines() if line.split("=", 1)[0] not in drop) + "\n"


def test_systemd_accepts_every_unit(valid_results, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (tests/run installs systemd-container, which brings it)")
    files = []
    for case, result in valid_results.items():
        for name, got in result["units"].items():
            path = tmp_path / f"dflash-{case}-{name}.service"
            path.write_text(_for_this_systemd(got["text"]))
            files.append(path)
    r = _verify(files)
    assert r.returncode == 0 and "Unknown key" not in r.stderr, r.stderr
    for path in files:
        r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                           capture_output=True, text=True, timeout=60)
        score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout).group(1))
        assert score <= MAX_EXPOSURE, (path.name, r.stdout)


def test_prebuilt_kernels_reach_the_settings_and_an_instances_own_value_wins(valid_results):
    plain = valid_results["plain"]["units"]["a"]
    assert plain["withKernels"]["environment"] == {"DFLASH_PREBUILT_KERNELS": "/nix/store/kernels"}
    assert {k: v for k, v in plain["withKernels"].items() if k != "environment"} == \
        {k: v for k, v in plain["settings"].items() if k != "environment"}
    own = valid_results["environment"]["units"]["a"]["withKernels"]["environment"]
    assert own == {"DFLASH_PREBUILT_KERNELS": "/nix/store/kernels", "NCCL_DEBUG": "WARN", "X": "$HOME %h 'q'"}
    mine = nix_unit.evaluate({"a": {**QWEN, "environment": {"DFLASH_PREBUILT_KERNELS": "/opt/k"}}})
    assert mine["units"]["a"]["withKernels"]["environment"] == {"DFLASH_PREBUILT_KERNELS": "/opt/k"}


def test_static_user_cache_outside_var_is_created_for_it(valid_results):
    assert valid_results["static-user-srv-cache"]["tmpfiles"] == ['d "/srv/hf cache/%%h" 0700 dflash dflash -']
    assert valid_results["static-user-and-group"]["tmpfiles"] == []  # systemd's CacheDirectory=%N
    assert valid_results["static-user-shared-cache"]["tmpfiles"] == []  # /var/cache: systemd owns it


# --- refusals ---------------------------------------------------------------------------------------

FIELDS = ("model", "servedModelName", "extraArgs", "environment", "apiKeyFile", "hfTokenFile",
          "cacheDir", "driverLibraryDir")


def _place(field: str, value: str):
    return {"extraArgs": ["--x", value], "environment": {"X": value}}.get(field, value)


def _raw_options(name: str, options: dict, field: str, value) -> dict:
    """Every option's value with `field` set to `value` as it is, even where dflashctl refuses it."""
    full = nix_unit.full_options(name, options)
    full[field] = value
    return full


def _hostile_cases():
    return [(f"{field}={v!r}", field, _place(field, v)) for v in HOSTILE for field in FIELDS]


HOSTILE_CASES = _hostile_cases()


@pytest.fixture(scope="module")
def hostile_results(paths):
    nix_or_skip()
    cases = [{"instances": {"a": _raw_options("a", QWEN, field, value)}, **paths}
             for _, field, value in HOSTILE_CASES]
    results, _ = nix_unit.evaluate_many(cases)
    return results


def test_hostile_values_are_rendered_or_refused_as_dflashctl_does(hostile_results, paths):
    """Each hostile value in each field: the same unit, or refused by both for the same reason."""
    seen = Counter()
    for (case, field, value), result in zip(HOSTILE_CASES, hostile_results):
        options = {**QWEN, field: value}
        problems, _ = config.problems_of(options, "a")
        control = [p for p in problems if "control character" in p]
        if control:  # refused by the Nix functions themselves, naming the same setting and reason
            for p in control:
                where, reason = p.split(": ", 1)
                reason = reason.rsplit(" (got ", 1)[0]
                assert f"{OPT}.a.{where}: {reason}" in result["failedAssertions"], (case, p, result)
            seen["control character"] += 1
            continue
        if problems:  # a type's refusal (an empty model, a relative path): refused by an assertion
            if not result["failedAssertions"]:  # or else by the build-time check of the settings
                errors, _, _ = validate.check({"instances": {"a": result["units"]["a"]["settings"]}})
                assert errors, case
                seen["build-time check"] += 1
            continue
        try:
            want = python_unit("a", options, paths)
        except DflashError as e:  # dflashctl unit refuses a path the unit cannot use: a NixOS assertion
            assert f"{OPT}.a.{e.setting}: {e.why}" in result["failedAssertions"], (case, e.why, result)
            seen["cache directory" if e.setting == "cacheDir" else "hidden path"] += 1
            continue
        assert result["failedAssertions"] == [], case
        got = result["units"]["a"]["text"]
        assert split_digest(sections(got))[0] == split_digest(want)[0], case
        seen["rendered"] += 1
    # every kind of outcome occurs, so no branch above is dead
    assert all(seen[k] > 0 for k in ("control character", "build-time check", "cache directory",
                                     "hidden path", "rendered")), seen


def test_systemd_accepts_every_unit_rendered_from_a_hostile_value(hostile_results, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (tests/run installs systemd-container, which brings it)")
    files = []
    for (case, field, value), result in zip(HOSTILE_CASES, hostile_results):
        if result["failedAssertions"] or config.problems_of({**QWEN, field: value}, "a")[0]:
            continue  # refused, not rendered (the test above says by whom)
        path = tmp_path / f"dflash-hostile{len(files)}.service"
        path.write_text(_for_this_systemd(result["units"]["a"]["text"]))
        files.append(path)
    assert files
    r = _verify(files)
    assert r.returncode == 0 and "Unknown key" not in r.stderr, r.stderr


def _failed(instances: dict) -> list[str]:
    return nix_unit.evaluate(instances)["failedAssertions"]


@pytest.mark.parametrize("instances,message", [
    ({"a": {**QWEN, "hfTokenFile": "/nix/store/abc-token"}}, f"{OPT}.a.hfTokenFile points into the Nix store"),
    ({"a": {**QWEN, "apiKeyFile": "/nix/store/abc-key"}}, f"{OPT}.a.apiKeyFile points into the Nix store"),
    ({"a": {**QWEN, "user": "root"}}, f'{OPT}.a.user = "root" would run SGLang'),
    ({"a": {**QWEN, "cacheDir": "/var/cache/hf"}, "b": {**QWEN, "gpus": [1], "port": 30001,
                                                         "cacheDir": "/var/cache/hf"}},
     f"{OPT}.{{a,b}}.cacheDir: /var/cache/hf is shared by DynamicUser instances"),
], ids=["hf-token-in-store", "api-key-in-store", "user-root", "cache-shared-dynamic"])
def test_module_only_refusals(instances, message):
    """Rules only the module has (dflashctl unit renders for one DynamicUser instance)."""
    assert any(m.startswith(message) for m in _failed(instances)), _failed(instances)


def test_a_shared_cache_is_fine_for_one_static_user():
    assert _failed({"a": {**QWEN, "user": "u", "cacheDir": "/var/cache/hf"},
                    "b": {**QWEN, "user": "u", "gpus": [1], "port": 30001, "cacheDir": "/var/cache/hf"}}) == []


def test_instance_name_rule_is_dflashctls():
    for name in ("a.b", "-a", "x" * 65, "ü"):
        problems, _ = config.problems_of({**QWEN, "name": name})
        assert any(p.startswith("name: ") for p in problems), name
        full = {name: nix_unit.full_options("a", QWEN)}
        assert any(m.startswith(f"{OPT}.{name}: the instance name must be 1-64 letters")
                   for m in nix_unit.evaluate_many([{"instances": full}])[0][0]["failedAssertions"]), name


# --- the module's declarations -----------------------------------------------------------------------

MODULE_ONLY_OPTIONS = {"enable", "package", "openFirewall", "user", "group"}


@pytest.fixture(scope="module")
def declared() -> dict:
    return eval_json(nix_or_skip(), REPO / "tests" / "nix" / "harness" / "module-options.nix")


def test_settings_keys_are_dflashctls(valid_results):
    _, keys = nix_unit.evaluate_many([])
    assert keys == list(config.KEYS)


def test_module_declares_dflashctls_settings_with_its_defaults(declared):
    defaults = config.to_dict(config.InstanceConfig(name="x", model="m"))
    options = declared["instance"]
    assert set(options) == (set(config.KEYS) | {"speculative"} | MODULE_ONLY_OPTIONS) - {"package"}
    for key in config.KEYS:
        if key == "model":
            assert not options[key]["hasDefault"]  # required, as in dflashctl
            continue
        want = defaults[key]
        assert options[key]["default"] == (list(want) if isinstance(want, tuple) else want), key
    assert set(declared["speculative"]) == set(config.SPECULATIVE_KEYS)
    for key, decl in declared["speculative"].items():
        assert decl["default"] is None, key
    assert declared["speculative"]["algorithm"]["values"] == list(config.ALGORITHMS)
    assert options["grammarBackend"]["values"] == list(config.GRAMMAR_BACKENDS)
    assert declared["top"] == sorted(["package", "dflashctlPackage", "hostCompilerPackage", "kernelsPackage",
                                      "instances", "router", "upgrade", "rollout", "prometheus", "grafana"])
    every = [name for names in declared["byModule"] for name in names]
    assert sorted(every) == declared["top"]  # each declared by one module alone
    assert declared["kernels"] == {"type": "nullOr", "default": None, "hasDefault": True, "values": None}


def test_module_declares_the_monitoring_options_with_dflashctls_defaults(declared):
    """services.dflash.prometheus takes its defaults from data/monitoring/monitoring.json, as
    `dflashctl monitoring` does; it is on where the host runs Prometheus (Grafana: the dashboard)."""
    from dflashctl.operations import monitoring
    p = declared["prometheus"]
    assert set(p) == {"scrapeIntervalSec", "minAcceptLength", "ttftP99Sec", "alertFor", "gpuExporters"}
    assert p["scrapeIntervalSec"]["default"] == monitoring.data()["scrapeIntervalSec"]
    assert p["ttftP99Sec"]["default"] == monitoring.data()["thresholds"]["ttftP99Sec"]["default"]
    assert p["minAcceptLength"]["default"] == {} and p["alertFor"]["default"] == {} and p["gpuExporters"]["default"]
    assert declared["prometheusEnable"] == "config.services.prometheus.enable"
    assert declared["grafanaEnable"] == "config.services.grafana.enable"


def test_module_declares_the_routers_settings_with_their_defaults(declared):
    from dflashctl.operations import router
    options = declared["router"]
    settable = set(router.KEYS) - {"workers", "instanceUnits"}  # workers come from the instances
    assert set(options) == settable | {"enable", "remoteWorkers", "openFirewall"}
    from router_harness import MEASURED_DEFAULTS  # the measured ones, written out (docs/service.md)
    assert {k: options[k]["default"] for k in MEASURED_DEFAULTS} == MEASURED_DEFAULTS
    assert options["policy"]["values"] == list(router.POLICIES)
    assert options["logLevel"]["values"] == list(router.LOG_LEVELS)
    assert options["enable"]["default"] is False and options["remoteWorkers"]["default"] == []


def test_module_holds_declarations_and_wiring_only():
    """What decides a unit lives in nix/lib/, where tier 1 reaches it; nix/module.nix only imports
    one module per concern, each its options first, then its configuration."""
    modules = REPO / "nix" / "modules"
    text = "".join(p.read_text() for p in sorted(modules.glob("*.nix")))
    for needle in ("service-unit.json", "warnings.json", "controlProblem s.value", "cacheDirProblem",
                   "commandLine", "fill ", "hashString"):
        assert needle not in text, needle
    for wiring in ("serviceUnit.entry", "serviceUnit.assertions", "serviceUnit.warnings",
                   "serviceUnit.tmpfiles", "serviceUnit.settings", "serviceUnit.sharedCacheAssertions",
                   "routerUnit.entry", "rolloutUnit.entry"):
        assert wiring in text, wiring
    entry = (REPO / "nix" / "module.nix").read_text()
    imports = re.search(r"imports = \[(.*?)\];", entry, re.S).group(1)
    imported = re.findall(r"\./modules/([a-z-]+\.nix)", imports)
    assert sorted(imported) == sorted(p.name for p in modules.glob("*.nix") if p.name != "shared.nix")
    for name in imported:
        body = (modules / name).read_text()
        assert len(body.splitlines()) <= 200, name
        if "options." in body:  # options before config
            assert body.index("options.") < body.index("config = "), name


# --- the NixOS VM test (checks.nixos-vm), evaluated offline ------------------------------------------


@pytest.fixture(scope="module")
def vm_test() -> dict:
    nix_or_skip()
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", "--read-write-mode",
                        str(REPO / "tests" / "nix" / "harness" / "vm-test.nix")], capture_output=True, text=True,
                       env=nix_unit.nix_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_vm_test_hosts_are_valid_configurations(vm_test):
    assert set(vm_test["nodes"]) == {"good", "broken", "restarting"}
    for name, node in vm_test["nodes"].items():
        assert node["imports"] == ["the flake's module"], name
        configurations = [node["instances"]] + [
            {n: {**o, "environment": {**o.get("environment", {}), **spec.get(n, {}).get("environment", {})}}
             for n, o in node["instances"].items()} for spec in node["specialisations"].values()]
        for instances in configurations:  # the host, and each specialisation it switches to
            result = nix_unit.evaluate(instances)
            assert result["failedAssertions"] == [], name
            errors, _, _ = validate.check({"instances": {n: u["settings"] for n, u in result["units"].items()}})
            assert errors == [], name
    # the upgrade under load: one host of each kind, two instances, both changed by the switch
    for name, upgrade in (("good", "rolling"), ("restarting", "restart")):
        node = vm_test["nodes"][name]
        assert node["upgrade"] == upgrade and set(node["instances"]) == {"a", "b"}
        assert set(node["specialisations"]["v2"]) == {"a", "b"}
        assert node["kernelsPackage"] is None, name  # the flake's default would build the kernels
    assert "ln -s /stub/python3 $out/bin/python" in vm_test["nodes"]["broken"]["package"]["script"]
    # the real preflight, in dflashctl built as the flake builds it (nixpkgs' packaging: no locked wheel)
    assert vm_test["nodes"]["broken"]["dflashctlPackage"] == "/stub/dflashctl.nix"
    assert vm_test["nodes"]["good"]["package"] == "/stub/python-env"  # a Python with dflashctl alone


def test_vm_test_good_host_runs_the_stand_in_without_probes(vm_test):
    wrapper = vm_test["nodes"]["good"]["dflashctlPackage"]["text"]
    launcher = re.search(r'DFLASHCTL_SGLANG_LAUNCHER="(\S+) (\S+)"', wrapper)
    assert launcher and launcher.group(2).endswith("-standin_server.py")
    assert Path(launcher.group(2)).read_text() == (REPO / "tests/data/service/standin_server.py").read_text()
    assert "dflashctl serve --skip-preflight" in wrapper


def test_vm_test_script_uses_only_what_the_nixos_driver_gives(vm_test):
    """The test script is Python run by NixOS's test driver: it must compile, and every global it
    reads is a builtin, an import, its own, or one of the driver's (start_all and a machine per node)."""
    import ast
    import builtins
    tree = ast.parse(vm_test["testScript"])
    own = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    own |= {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    own |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    own |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    driver = {"start_all"} | set(vm_test["nodes"])
    assert read - own - set(dir(builtins)) == driver
