"""nix/module.nix through a real module system, where a nixpkgs lib is at hand (tests/nix/harness/module-eval.nix).

nixpkgs' lib is not part of this repository and cannot be fetched here: set DFLASH_NIXPKGS_LIB to
a directory holding lib/default.nix (e.g. a checkout of nix-community/nixpkgs.lib), or
DFLASH_NIXPKGS to a nixpkgs checkout. Without one every test here is skipped with that reason;
tier 2 (nix flake check: checks.nixos-example, checks.nixos-vm) covers the same against NixOS.
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import nix_unit
from conftest import REPO, nix_or_skip
from dflashctl.operations import unit_data
from nixeval import nixpkgs_lib

pytestmark = pytest.mark.nix
EVAL = REPO / "tests" / "nix" / "harness" / "module-eval.nix"
OPT = "services.dflash.instances"
QWEN = {"model": "Qwen/Qwen3-8B", "gpus": [0]}


@pytest.fixture(autouse=True)
def _lib():
    nix_or_skip()
    if nixpkgs_lib() is None:
        pytest.skip("no nixpkgs lib: set DFLASH_NIXPKGS_LIB to a nix-community/nixpkgs.lib checkout "
                    "(outside the repository); tier 2 evaluates the module in NixOS itself")


class Refused(Exception):
    pass


def evaluate(instances: dict, host: str | None = None, router: dict | None = None) -> dict:
    args = ["nix-instantiate", "--eval", "--strict", "--json", str(EVAL), "--arg", "lib",
            f"import {nixpkgs_lib()}", "--argstr", "instancesJSON", json.dumps(instances),
            "--argstr", "routerJSON", json.dumps(router or {})]
    with tempfile.TemporaryDirectory(prefix="dflash-host-") as d:
        if host is not None:
            (Path(d) / "host.nix").write_text(host)
            args += ["--arg", "host", f"import {d}/host.nix"]
        r = subprocess.run(args, capture_output=True, text=True, env=nix_unit.nix_env(), timeout=300)
    if r.returncode != 0:
        raise Refused(r.stderr)
    return json.loads(r.stdout)


@pytest.mark.parametrize("options,option", [
    ({"model": "m\n[Service]\nExecStartPre=/bin/sh"}, "model"),
    ({"cacheDir": "/var/cache/hf\nX=1"}, "cacheDir"),
    ({"environment": {"X": "1\nY=2"}}, "environment.X"),
    ({"host": "0.0.0.0\x1b"}, "host"),
], ids=["model-newline", "cache-dir-newline", "environment-newline", "host-escape"])
def test_option_types_refuse_control_characters(options, option):
    with pytest.raises(Refused) as e:
        evaluate({"a": {**QWEN, **options}})
    assert f"{OPT}.a.{option}' is not of type" in str(e.value)
    assert "string without newlines or other control characters" in str(e.value)


@pytest.mark.parametrize("options,option", [
    ({"port": 70000}, "port"), ({"grammarBackend": "fast"}, "grammarBackend"),
    ({"user": "my user"}, "user"), ({"speculative": {"algorithm": "MEDUSA"}}, "speculative.algorithm"),
    ({"tpSize": 0}, "tpSize"), ({"memFractionStatic": 1.5}, "memFractionStatic"),
])
def test_option_types_refuse_out_of_range_values(options, option):
    with pytest.raises(Refused) as e:
        evaluate({"a": {**QWEN, **options}})
    assert f"{OPT}.a.{option}' is not of type" in str(e.value)


def test_an_unknown_option_is_refused():
    with pytest.raises(Refused) as e:
        evaluate({"a": {**QWEN, "prot": 1}})
    assert f"{OPT}.a.prot' does not exist" in str(e.value)


def test_the_wiring_carries_the_pure_entry():
    """systemd.services.dflash-a is nix/lib/service-unit.nix's entry, whole, and its digest is
    dflashctl's rule over the unit NixOS writes from it (what NixOS adds included)."""
    instances = {"a": {**QWEN, "apiKeyFile": "/run/k", "cacheDir": "/var/cache/hf", "user": "svc"}}
    got = evaluate(instances)["services"]["dflash-a"]
    full = {"a": nix_unit.full_options("a", instances["a"])}
    exec_start = got["serviceConfig"]["ExecStart"].split()
    want = nix_unit.evaluate_many([{
        "instances": full, "dflashctl": exec_start[0], "python": exec_start[-1],
        "settingsFiles": {"a": exec_start[3]}, "path": got["path"],
        "nixos": {"restartIfChanged": got["restartIfChanged"]}}])[0][0]["units"]["a"]["entry"]
    assert exec_start[3].endswith("-dflash-a.json")
    assert got["path"] == ["/nix/store/00000000000000000000000000000000-gcc-wrapper"]
    assert got["environment"] == {"PATH": f"{got['path'][0]}/bin:{got['path'][0]}/sbin"}  # NixOS's, from path
    for key in ("description", "after", "wants", "before", "wantedBy", "unitConfig", "serviceConfig", "path"):
        assert got[key] == want[key], key
    assert got["before"] == ["dflash-router.service"]
    from dflashctl.service.unit import definition_digest
    unit, digest = nix_unit.without_digest(nix_unit.nixos_written(got))
    assert digest == definition_digest(unit)


HOST_CHANGES = [
    ("a host's environment variable", "{ systemd.services.dflash-a.environment.NCCL_DEBUG = \"INFO\"; }"),
    ("a host's path", "{ systemd.services.dflash-a.path = [ \"/opt/tools\" ]; }"),
    ("systemd.globalEnvironment", "{ systemd.globalEnvironment.TZDIR = \"/nix/store/tzdata-2\"; }"),
    ("restartIfChanged", "{ services.dflash.upgrade = \"rolling\"; }"),
    ("the host compiler", "{ services.dflash.hostCompilerPackage = { type = \"derivation\"; name = \"gcc\";"
                          " outPath = \"/nix/store/22222222222222222222222222222222-gcc\"; }; }"),
    ("the stack", "{ services.dflash.package = { type = \"derivation\"; name = \"env\";"
                  " outPath = \"/nix/store/22222222222222222222222222222222-dflash-env\"; }; }"),
    ("a directive's setting", "{ services.dflash.instances.a.startTimeoutSec = 60; }"),
]


def test_whatever_a_host_changes_in_a_unit_changes_its_digest():
    """What NixOS writes into an instance's unit beside the module's entry (PATH from `path`, a
    host's variables, systemd.globalEnvironment, X-RestartIfChanged) is under its digest, through
    the real module system: each change alone gives another digest, and every digest is
    dflashctl's rule over the unit as written."""
    from dflashctl.service.unit import definition_digest
    seen = {}
    for what, host in [("nothing", None), ("nothing, again", "{ }")] + HOST_CHANGES:
        out = evaluate({"a": QWEN}, host)
        got = out["services"]["dflash-a"]
        unit, digest = nix_unit.without_digest(nix_unit.nixos_written(got, out["globalEnvironment"]))
        assert digest == definition_digest(unit), what
        seen[what] = digest
    assert seen["nothing"] == seen["nothing, again"]
    assert len(set(seen.values())) == len(HOST_CHANGES) + 1, seen


def test_a_hosts_definitions_win_over_the_modules():
    host = ('{ systemd.services.dflash-a = { description = "mine"; after = [ "x.service" ];'
            ' serviceConfig.Restart = "always"; serviceConfig.DeviceAllow = [ "/dev/null rw" ];'
            ' unitConfig.StartLimitBurst = 3; }; }')
    got = evaluate({"a": QWEN}, host)["services"]["dflash-a"]
    assert got["description"] == "mine" and got["serviceConfig"]["Restart"] == "always"
    assert got["serviceConfig"]["DeviceAllow"] == ["/dev/null rw"]
    assert got["unitConfig"]["StartLimitBurst"] == 3
    assert sorted(got["after"]) == ["network-online.target", "x.service"]  # lists merge


def test_users_new_and_existing():
    out = evaluate({"a": {**QWEN, "user": "dflash"}, "b": {**QWEN, "gpus": [1], "port": 30001}})
    assert out["users"]["dflash"] == {"isSystemUser": True, "isNormalUser": False, "group": "dflash"}
    assert "dflash" in out["groups"]
    out = evaluate({"a": {**QWEN, "user": "alice", "cacheDir": "/srv/hf"}},
                   "{ users.users.alice.isNormalUser = true; }")
    assert out["users"]["alice"] == {"isSystemUser": False, "isNormalUser": True, "group": "users"}
    assert out["tmpfiles"] == ["d /srv/hf 0700 alice users -"]  # the user's own primary group


def test_assertions_warnings_and_checks_reach_nixos():
    out = evaluate({"a": {**QWEN, "hfTokenFile": "/nix/store/x-token"}})
    assert any(m.startswith(f"{OPT}.a.hfTokenFile points into the Nix store") for m in out["failedAssertions"])
    out = evaluate({"a": {**QWEN, "grammarBackend": "none", "host": "0.0.0.0", "openFirewall": True},
                    "b": {**QWEN, "gpus": [1], "port": 30001, "speculative": {"algorithm": "DDTREE"},
                          "draftModel": "d"}})
    assert out["failedAssertions"] == []
    assert out["warnings"] == nix_unit.evaluate({
        "a": {**QWEN, "grammarBackend": "none", "host": "0.0.0.0"},
        "b": {**QWEN, "gpus": [1], "port": 30001, "speculative": {"algorithm": "DDTREE"},
              "draftModel": "d"}})["warnings"]
    assert out["firewall"] == [30000]
    assert out["checks"] == ["dflash-validate-settings", "dflash-validate-b-package"]
    # models that are store paths: the build reads the pair itself (`validate --models`)
    store = {"model": "/nix/store/00000000000000000000000000000000-Qwen3-8B",
             "draftModel": "/nix/store/00000000000000000000000000000000-Qwen3-8B-DFlash-b16",
             "speculative": {"algorithm": "DFLASH"}}
    out = evaluate({"a": QWEN, "c": {**QWEN, **store, "gpus": [1], "port": 30001},
                    "d": {**QWEN, **store, "draftModel": "z-lab/Qwen3-8B-DFlash-b16", "gpus": [2], "port": 30002}})
    assert out["checks"] == ["dflash-validate-settings", "dflash-validate-c-models"]


def test_disabled_instances_have_no_unit():
    out = evaluate({"a": QWEN, "b": {**QWEN, "gpus": [1], "port": 30001, "enable": False}})
    assert list(out["services"]) == ["dflash-a"]


# --- services.dflash.router ----------------------------------------------------------------------------

def test_router_wiring_carries_the_pure_directives_and_settings():
    from nixos_host import nix_router
    instances = {"a": QWEN, "b": {**QWEN, "gpus": [1], "port": 30001}}
    out = evaluate(instances, router={"enable": True, "openFirewall": True, "drainSec": 60})
    got = out["services"]["dflash-router"]
    pure = nix_router({"drainSec": 60}, instances)["settings"]
    # no instance in the router's unit: each orders itself before it (their `before`)
    assert got["after"] == got["wants"] == ["network-online.target"] and got["before"] == []
    assert out["services"]["dflash-a"]["before"] == ["dflash-router.service"]
    service = got["serviceConfig"]
    assert service["ExecStart"].endswith(" router --config /etc/dflash-router.json --python "
                                         "/nix/store/00000000000000000000000000000000-dflash-router-env/bin/python")
    assert service["ExecReload"] == service["ExecStart"] + " --sync"
    assert service["TimeoutStopSec"] == f"{60 + 15}s" and service["DevicePolicy"] == "closed"
    assert "DeviceAllow" not in service and service["PrivateDevices"] is True
    assert out["etc"] == {"dflash-router.json": "/nix/store/11111111111111111111111111111111-dflash-router.json",
                          "dflash-instances.json": "/nix/store/11111111111111111111111111111111-dflash-instances.json"}
    # a change of workers reloads the router, any other change restarts it
    assert json.loads(got["reloadTriggers"][0]) == pure["workers"]
    assert json.loads(got["restartTriggers"][0]) == {k: v for k, v in pure.items()
                                                     if k not in ("workers", "instanceUnits")}
    assert "dflash-validate-router" in out["checks"] and 30080 in out["firewall"]


def test_router_refusals_are_nixos_assertions():
    out = evaluate({"a": QWEN}, router={"enable": True, "port": 40000})
    assert any("services.dflash.router.port: 40000 clashes with instance 'a'" in m
               for m in out["failedAssertions"])
    with pytest.raises(Refused) as e:
        evaluate({"a": QWEN}, router={"enable": True, "policy": "sticky"})
    assert "services.dflash.router.policy' is not of type" in str(e.value)


def test_no_router_unless_enabled():
    assert "dflash-router" not in evaluate({"a": QWEN})["services"]


# --- services.dflash.upgrade -----------------------------------------------------------------------------

def test_rolling_upgrades_are_the_default_with_the_router_and_restart_otherwise():
    instances = {"a": QWEN, "b": {**QWEN, "gpus": [1], "port": 30001}}
    rolling = evaluate(instances, router={"enable": True})["services"]
    assert [rolling[f"dflash-{n}"]["restartIfChanged"] for n in "ab"] == [False, False]
    rollout = rolling["dflash-rollout"]
    argv = rollout["serviceConfig"]["ExecStart"].split()
    d = unit_data.canary_data()["defaults"]
    assert argv[1:] == ["rollout", "--instance", "/nix/store/11111111111111111111111111111111-dflash-instances.json",
                        "--router", "/etc/dflash-router.json", "--resume", "--batch", "1", "--healthy-for", "10",
                        "--canary-prompts", str(d["prompts"]), "--canary-tokens", str(d["tokens"]),
                        "--canary-repeats", str(d["repeats"]), "--canary-min-accept-ratio", str(d["minAcceptRatio"]),
                        "--canary-min-speed-ratio", str(d["minSpeedRatio"])]
    assert rollout["after"] == ["dflash-router.service", "dflash-a.service", "dflash-b.service"]
    # the switch waits for the rollout's verdict (rollout.waitForVerdict), within a bound
    assert rollout["wantedBy"] == ["multi-user.target"] and rollout["serviceConfig"]["Type"] == "oneshot"
    assert int(rollout["serviceConfig"]["TimeoutStartSec"].rstrip("s")) > 2 * 900
    assert len(rollout["restartTriggers"]) == 2  # each instance's unit: a switch that changes one restarts it
    restart = evaluate(instances)["services"]  # no router: NixOS restarts them, as before
    assert "dflash-rollout" not in restart and restart["dflash-a"]["restartIfChanged"] is True


def test_a_host_can_choose_either_way_and_tune_the_rollout():
    host = ('{ services.dflash.upgrade = "rolling"; services.dflash.rollout = { batch = 2; waitForVerdict = false; '
            'canary = { minSpeedRatio = 0.7; expect = [ "stack" ]; }; }; }')
    out = evaluate({"a": QWEN}, host=host)["services"]
    argv = out["dflash-rollout"]["serviceConfig"]["ExecStart"].split()
    assert "--no-router" in argv and argv[argv.index("--batch") + 1] == "2"
    assert argv[argv.index("--canary-min-speed-ratio") + 1] == "0.7"
    assert argv[argv.index("--canary-expect") + 1] == "stack"
    assert out["dflash-rollout"]["serviceConfig"]["Type"] == "notify"
    for bad in ("canary.minSpeedRatio = 1.0;", "canary.tokens = 1000000000;", 'canary.expect = [ "nothing" ];'):
        with pytest.raises(Refused) as e:
            evaluate({"a": QWEN}, host=f'{{ services.dflash.upgrade = "rolling"; services.dflash.rollout.{bad} }}')
        assert "services.dflash.rollout.canary." in str(e.value) and "is not of type" in str(e.value), bad
    # the old option: an assertion naming what replaced it (NixOS's mkRemovedOptionModule)
    out = evaluate({"a": QWEN},
                   host='{ services.dflash.upgrade = "rolling"; services.dflash.rollout.requireIdentical = true; }')
    [message] = [m for m in out["failedAssertions"] if "requireIdentical" in m]
    assert "no longer has any effect" in message and "services.dflash.rollout.canary.expect" in message
    out = evaluate({"a": QWEN}, host='{ services.dflash.upgrade = "restart"; }', router={"enable": True})
    assert "dflash-rollout" not in out["services"] and out["services"]["dflash-a"]["restartIfChanged"] is True
    with pytest.raises(Refused) as e:
        evaluate({"a": QWEN}, host='{ services.dflash.upgrade = "all-at-once"; }')
    assert "services.dflash.upgrade' is not of type" in str(e.value)


def test_a_path_the_sandbox_hides_is_a_nixos_assertion():
    """The unit path rule (issue 34) reaches NixOS: a local model under /home is refused naming its
    option; the ExecStart paths the module names itself (store paths) pass it."""
    out = evaluate({"a": {**QWEN, "model": "/home/me/models/qwen"}})
    assert f"{OPT}.a.model: /home/me/models/qwen is hidden from the service by ProtectHome=true" \
        in out["failedAssertions"]
    assert evaluate({"a": QWEN})["failedAssertions"] == []
    assert evaluate({"a": QWEN}, router={"enable": True})["failedAssertions"] == []


def test_monitoring_options_are_typed_and_reach_prometheus_and_grafana():
    from dflashctl.operations import monitoring
    from dflashctl.service import config
    host = ('{ services.prometheus.enable = true; services.grafana.enable = true;'
            ' services.dflash.prometheus.minAcceptLength.a = 3; services.dflash.prometheus.scrapeIntervalSec = 5; }')
    out = evaluate({"a": {**QWEN, "draftModel": "d", "speculative": {"algorithm": "DFLASH"}}}, host=host)
    cfg = config.from_dict({**QWEN, "draftModel": "d", "speculative": {"algorithm": "DFLASH"}}, "a")
    assert out["prometheus"]["scrapeConfigs"] == monitoring.scrape_configs([cfg], interval_sec=5)
    assert out["prometheus"]["ruleFiles"] == ["/nix/store/11111111111111111111111111111111-dflash.rules.json"]
    assert [p["name"] for p in out["grafanaProviders"]] == ["dflash"]
    assert evaluate({"a": QWEN})["prometheus"] == {"scrapeConfigs": [], "ruleFiles": []}  # no Prometheus here
    with pytest.raises(Refused) as e:
        evaluate({"a": QWEN}, host='{ services.prometheus.enable = true; services.dflash.prometheus.minAcceptLength.a = "x"; }')
    assert "services.dflash.prometheus.minAcceptLength.a' is not of type" in str(e.value)
