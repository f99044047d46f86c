"""services.dflash.upgrade = "rolling": dflash-rollout.service from nix/lib/rollout-unit.nix, without nixpkgs.

The pure function is evaluated with plain Nix over the module's own instance entries
(nix/lib/service-unit.nix, through tests/nix_unit.py): its command line must be one dflashctl's
own parser accepts with the settings asked for, its triggers must change exactly when an
instance's unit does, and systemd must accept the unit. The option declarations are read offline
(tests/nix/harness/module-options.nix) and must default to what `dflashctl rollout` itself does.
"""

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import nix_unit
import pytest
from conftest import nix_or_skip
from dflashctl import cli
from dflashctl.operations import unit_data
from nixeval import eval_json, nix_env

REPO = Path(__file__).resolve().parent.parent.parent
ROLLOUT = REPO / "nix" / "lib" / "rollout-unit.nix"
SERVICE = REPO / "nix" / "lib" / "service-unit.nix"
ENTRY = REPO / "nix" / "lib" / "service-entry.nix"
QWEN = {"model": "Qwen/Qwen3-8B", "draftModel": "z-lab/Qwen3-8B-DFlash-b16",
        "speculative": {"algorithm": "DFLASH"}}


def rollout_unit(instances: dict, rollout: dict, router: bool = True, dflashctl: str = "/opt/dflash/bin/dflashctl",
                 drain_sec: int = 30) -> dict:
    """The rollout unit as NixOS writes it ({ Unit, Service, Install }) for `instances` as a host
    writes them (unset options defaulted), and its restartTriggers. `rollout`: services.dflash.rollout
    as a host sets it, over the module's defaults (DEFAULTS)."""
    rollout = {**DEFAULTS, **rollout, "canary": {**DEFAULTS["canary"], **rollout.get("canary", {})}}
    nix_or_skip()
    full = {n: nix_unit.full_options(n, o) for n, o in instances.items()}
    expr = f"""
      let
        r = import {ROLLOUT};
        s = import {SERVICE};
        instances = builtins.fromJSON {json.dumps(json.dumps(full))};
        entry = r.entry {{
          dflashctl = "{dflashctl}";
          instancesFile = "/nix/store/00000000000000000000000000000000-dflash-instances.json";
          routerSettingsFile = {'"/etc/dflash-router.json"' if router else "null"};
          drainSec = {drain_sec if router else 0};
          inherit instances;
          instanceEntries = builtins.mapAttrs (name: i: s.entry {{
            inherit name; instance = i; dflashctl = "{dflashctl}"; python = "/opt/env/bin/python";
            # as pkgs.writeText's store path: it changes with the settings it holds
            settingsFile = "/nix/store/${{builtins.substring 0 32 (builtins.hashString "sha256"
              (builtins.toJSON (s.settings name i)))}}-dflash-${{name}}.json";
            path = [ "/opt/gcc" ];
            nixos = {{ environment = {{ }}; restartIfChanged = false; globalEnvironment = {{ }}; }};
          }}) instances;
          rollout = builtins.fromJSON {json.dumps(json.dumps(rollout))};
        }};
      in (import {ENTRY}).written entry // {{ inherit (entry) restartTriggers; }}"""
    r = subprocess.run(["nix", "eval", "--json", "--impure", "--expr", expr], capture_output=True, text=True,
                       env=nix_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# services.dflash.rollout's defaults as the module declares them (checked against the module below)
CANARY = unit_data.canary_data()
DEFAULTS = {"batch": 1, "healthyForSec": 10, "waitForVerdict": True,
            "canary": {"enable": True, "expect": [], **CANARY["defaults"]}}


def parsed(exec_start: str):
    argv = shlex.split(exec_start)
    return cli.build_parser(argv[1:]).parse_args(argv[1:])


def rollout_takes_the_canary_flags() -> bool:
    try:
        cli.build_parser(["rollout"]).parse_args(["rollout", "--canary-repeats", "3"])
    except (cli.UsageError, SystemExit):
        return False
    return True


CANARY_WIRED = pytest.mark.xfail(
    not rollout_takes_the_canary_flags(), strict=True,
    reason="`dflashctl rollout` does not take canary.add_arguments' flags until the rollout's canary "
           "(branch r1-rollout) is merged")


def seconds(value: str) -> int:
    assert value.endswith("s"), value
    return int(value[:-1])


def worst_case_sec(instances: dict, rollout: dict, drain_sec: int) -> int:
    """The whole rollout's bound, from dflashctl's own figures: each instance's drain, two canary
    readings (every prompt asked repeats + 1 times, each within canary.request_limit), its start
    (startTimeoutSec + the unit's margin), the healthy hold and the rollout unit's margin."""
    import math
    from dflashctl.operations import canary
    from dflashctl.service import config
    from dflashctl.service.unit_text import unit_data as service_unit_data
    c = rollout["canary"]
    reading = c["prompts"] * (c["repeats"] + 1) * canary.request_limit(c["tokens"]) if c["enable"] else 0
    data = unit_data.rollout_unit_data()
    per = [drain_sec + 2 * reading + config.from_dict(o, n).start_timeout_sec
           + service_unit_data()["timeoutStartMarginSec"] + rollout["healthyForSec"] + data["perInstanceMarginSec"]
           for n, o in instances.items()]
    return math.ceil(sum(per) + data["stopMarginSec"])


@CANARY_WIRED
def test_the_command_line_is_one_dflashctl_accepts_with_the_settings_asked_for():
    from dflashctl.operations import canary
    two = {"a": QWEN, "b": {**QWEN, "port": 30001, "startTimeoutSec": 1800}}
    asked = {"batch": 2, "healthyForSec": 30,
             "canary": {"prompts": 8, "tokens": 256, "repeats": 5, "minAcceptRatio": 0.85, "minSpeedRatio": 0.7,
                        "expect": ["stack", "drafter"]}}
    d = rollout_unit(two, asked)
    args = parsed(d["Service"]["ExecStart"])
    assert args.command == "rollout" and args.func.__module__ == "dflashctl.operations.rollout"
    assert args.instance == ["/nix/store/00000000000000000000000000000000-dflash-instances.json"]
    assert args.router == "/etc/dflash-router.json" and not args.no_router
    # --batch: the rollout's own dest for it (max_unavailable, where it became an alias of that)
    batch = vars(args).get("max_unavailable", vars(args).get("batch"))
    assert (batch, args.healthy_for, args.resume) == (2, 30.0, True)
    assert canary.settings_of(args) == canary.CanarySettings(
        prompts=8, tokens=256, repeats=5, min_accept_ratio=0.85, min_speed_ratio=0.7,
        expect_change=frozenset({"stack", "drafter"}))
    assert d["Unit"]["After"] == ["dflash-router.service", "dflash-a.service", "dflash-b.service"]
    # SIGTERM finishes the batch in progress: the slowest start (1800 s + the unit's margin) and more
    assert seconds(d["Service"]["TimeoutStopSec"]) > 1800 + 30 + 2 * 8 * 6 * canary.request_limit(256)
    assert d["Service"]["Restart"] == "no"

    # the defaults: the canary as dflashctl's own defaults, and the switch waits for the verdict
    plain = rollout_unit({"a": QWEN}, {}, router=False)
    args = parsed(plain["Service"]["ExecStart"])
    assert args.no_router and args.router is None
    assert canary.settings_of(args) == canary.CanarySettings()

    off = parsed(rollout_unit({"a": QWEN}, {"canary": {"enable": False}})["Service"]["ExecStart"])
    assert canary.settings_of(off) == canary.CanarySettings(enabled=False)


@pytest.mark.parametrize("router", [True, False])
def test_the_switch_waits_for_the_verdict_within_every_instances_worst_case(router):
    """waitForVerdict (the default): Type=oneshot, so systemd's start job, and with it the switch, ends
    when the rollout exits and fails when it exits non-zero; TimeoutStartSec covers every instance."""
    three = {"a": QWEN, "b": {**QWEN, "port": 30001, "startTimeoutSec": 1800},
             "c": {**QWEN, "port": 30002, "startTimeoutSec": 60}}
    asked = {"healthyForSec": 20, "canary": {"prompts": 2, "tokens": 64, "repeats": 1}}
    d = rollout_unit(three, asked, router=router, drain_sec=45)
    assert d["Service"]["Type"] == "oneshot"
    want = worst_case_sec(three, {**DEFAULTS, **asked, "canary": {**DEFAULTS["canary"], **asked["canary"]}},
                          45 if router else 0)
    assert seconds(d["Service"]["TimeoutStartSec"]) == want
    # more than the three starts alone; each instance's own deadlines end a step well before
    assert want > 900 + 1800 + 60
    # a canary that asks more (or none) moves the bound with it
    more = rollout_unit(three, {**asked, "canary": {"prompts": 4, "tokens": 64, "repeats": 1}}, router=router)
    none = rollout_unit(three, {**asked, "canary": {"enable": False}}, router=router)
    assert seconds(none["Service"]["TimeoutStartSec"]) < want < seconds(more["Service"]["TimeoutStartSec"])


def test_without_waiting_the_switch_returns_once_the_plan_is_made():
    d = rollout_unit({"a": QWEN}, {"waitForVerdict": False})
    assert d["Service"]["Type"] == "notify" and d["Service"]["NotifyAccess"] == "main"
    assert "TimeoutStartSec" not in d["Service"]  # READY=1 comes once the plan is made: systemd's default


def test_a_change_of_one_instance_changes_its_trigger_and_nothing_else():
    base = {"a": QWEN, "b": {**QWEN, "port": 30001}}
    before = rollout_unit(base, DEFAULTS)["restartTriggers"]
    same = rollout_unit(base, DEFAULTS)["restartTriggers"]
    changed = rollout_unit({**base, "b": {**base["b"], "memFractionStatic": 0.8}}, DEFAULTS)["restartTriggers"]
    assert before == same and len(before) == 2
    assert changed[0] == before[0] and changed[1] != before[1]
    assert all("DFLASH_UNIT_DIGEST=" in t for t in before)  # what the rollout compares, in the trigger


def test_systemd_accepts_the_rollout_unit(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (tests/run installs systemd-container, which brings it)")
    exe = tmp_path / "dflashctl"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    d = rollout_unit({"a": QWEN}, DEFAULTS, dflashctl=str(exe))
    lines = []
    for section in ("Unit", "Service", "Install"):
        lines.append(f"[{section}]")
        for key, value in d[section].items():
            for v in value if isinstance(value, list) else [value]:
                lines.append(f"{key}={'true' if v is True else 'false' if v is False else v}")
    unit = tmp_path / "dflash-rollout.service"
    unit.write_text("\n".join(lines) + "\n")
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines()
                if "dflash-rollout.service" in l and "dflash-a.service" not in l and "dflash-router" not in l]
    assert not problems, r.stdout + r.stderr


def test_the_module_declares_upgrade_and_rollout_with_dflashctls_defaults():
    from dflashctl.operations.canary_verdict import EXPECT, CanarySettings
    declared = eval_json(nix_or_skip(), REPO / "tests" / "nix" / "harness" / "module-options.nix")
    assert declared["upgrade"]["values"] == ["rolling", "restart"]
    assert declared["upgrade"]["defaultText"] == \
        'if config.services.dflash.router.enable then "rolling" else "restart"'
    defaults = cli.build_parser(["rollout"]).parse_args(["rollout"])  # what `dflashctl rollout` does alone
    options = declared["rollout"]
    assert options["batch"]["default"] == vars(defaults).get("max_unavailable", vars(defaults).get("batch")) == 1
    assert options["healthyForSec"]["default"] == defaults.healthy_for == DEFAULTS["healthyForSec"]
    assert options["waitForVerdict"] == {"type": "bool", "default": True, "hasDefault": True, "values": None}
    # the canary: dflashctl's defaults and bounds (data/canary.json, which both read)
    c = declared["canary"]
    assert {k: c[k]["default"] for k in c} == DEFAULTS["canary"]
    settings = CanarySettings()
    assert (c["prompts"]["default"], c["tokens"]["default"], c["repeats"]["default"], c["minAcceptRatio"]["default"],
            c["minSpeedRatio"]["default"], c["enable"]["default"]) == \
        (settings.prompts, settings.tokens, settings.repeats, settings.min_accept_ratio, settings.min_speed_ratio,
         settings.enabled)
    assert {k: c[k]["bounds"] for k in CANARY["bounds"]} == CANARY["bounds"]
    assert c["expect"]["values"] == sorted(EXPECT)
    # the old switch is refused with what replaces it
    [removed] = declared["removed"]
    assert removed["removed"] == ["services", "dflash", "rollout", "requireIdentical"]
    assert "services.dflash.rollout.canary.expect" in removed["replacement"]


def test_a_host_still_setting_require_identical_is_told_what_replaced_it():
    import nixos_host
    host = nixos_host.host_config({"a": QWEN}, {}, "rolling", {"requireIdentical": True})
    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", str(nixos_host.HOST_UNITS),
                        "--argstr", "hostJSON", json.dumps(host), "--argstr", "packagesJSON", "{}"],
                       capture_output=True, text=True, env=nix_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    [message] = json.loads(r.stdout)["failedAssertions"]
    assert message.startswith("The option definition `services.dflash.rollout.requireIdentical' no longer has any "
                              "effect; please remove it.")
    assert 'services.dflash.rollout.canary.expect = [ "outputs" ]' in message


# --- nixos-rebuild switch over a whole host: which units it restarts, from the module's pure functions --

TWO = {"a": {**QWEN, "gpus": [0]}, "b": {**QWEN, "gpus": [1], "port": 30001}}
EVERYTHING = {"dflash-a.service", "dflash-b.service", "dflash-router.service", "dflash-rollout.service"}


def switch(old: dict, new: dict, active: set[str] = EVERYTHING - {"dflash-rollout.service"}) -> dict:
    """What switch-to-configuration does (tests/nixos_switch.py) between two hosts' units; the rollout
    unit is inactive between rollouts (it exits when done)."""
    import nixos_switch
    return nixos_switch.switch(old, new, active)


@pytest.mark.parametrize("upgrade", ["rolling", "restart"])
def test_a_new_stack_restarts_every_instance_at_once_unless_rolling(upgrade):
    import nixos_host
    old = nixos_host.host_units(TWO, {}, upgrade)
    new = nixos_host.host_units(TWO, {}, upgrade, python="/nix/store/e2-dflash-env/bin/python")
    done = switch(old, new)
    if upgrade == "restart":  # today's default: both at once (stopIfChanged: stopped, then started)
        assert done == {"dflash-a.service": "restart", "dflash-b.service": "restart",
                        "dflash-router.service": "nothing"}
    else:  # the instances keep running; the rollout unit, started, restarts them one at a time
        assert done == {"dflash-a.service": "nothing", "dflash-b.service": "nothing",
                        "dflash-router.service": "nothing", "dflash-rollout.service": "start"}
        # and one still running from an earlier switch is restarted onto the new definitions
        assert switch(old, new, EVERYTHING)["dflash-rollout.service"] == "restart"


def test_rolling_one_instances_setting_changes_only_what_it_must():
    import nixos_host
    old = nixos_host.host_units(TWO, {}, "rolling")
    changed = {**TWO, "b": {**TWO["b"], "memFractionStatic": 0.8}}
    new = nixos_host.host_units(changed, {}, "rolling")
    assert old["dflash-a.service"] == new["dflash-a.service"]  # a's unit is the same file
    assert old["dflash-b.service"] != new["dflash-b.service"]  # b's changed, and is left running
    assert switch(old, new, EVERYTHING) == {"dflash-a.service": "nothing", "dflash-b.service": "nothing",
                                            "dflash-router.service": "nothing",
                                            "dflash-rollout.service": "restart"}
    assert switch(old, old, EVERYTHING)["dflash-rollout.service"] == "nothing"  # the control


def test_rolling_an_instance_added_is_started_and_the_router_reloaded():
    import nixos_host
    old = nixos_host.host_units({"a": TWO["a"]}, {}, "rolling")
    new = nixos_host.host_units(TWO, {}, "rolling")
    done = switch(old, new, {"dflash-a.service", "dflash-router.service"})
    assert done == {"dflash-a.service": "nothing", "dflash-b.service": "start",
                    "dflash-router.service": "reload", "dflash-rollout.service": "start"}


# --- the digest: every change to an instance's unit is rolled out ------------------------------------

def digest_of(unit: dict) -> str:
    """DFLASH_UNIT_DIGEST= of a unit's Environment= lines (what `systemctl show` reports)."""
    found = [e.split("=", 1)[1] for e in unit["Service"]["Environment"] if e.startswith("DFLASH_UNIT_DIGEST=")]
    assert len(found) == 1, unit["Service"]["Environment"]
    return found[0]


LOCALES = {"LOCALE_ARCHIVE": "/nix/store/l1-glibc-locales/lib/locale/locale-archive"}
ENTRY_CASE = {"path": ["/nix/store/c1-gcc-wrapper"], "python": "/nix/store/e1-dflash-env/bin/python",
              "dflashctl": "/nix/store/d1-dflashctl/bin/dflashctl",
              "settingsFiles": {"a": "/nix/store/s1-dflash-a.json"},
              "nixos": {"environment": {}, "restartIfChanged": False, "globalEnvironment": LOCALES}}
# Each changes one field of the instance's entry, or one thing NixOS writes into its unit beside it.
ENTRY_CHANGES = {
    "a directive (TimeoutStartSec)": ({"startTimeoutSec": 60}, {}),
    "a directive only a static user has (User=)": ({"user": "svc"}, {}),
    "the description (the model)": ({"model": "Qwen/Qwen3-14B"}, {}),
    "path": ({}, {"path": ["/nix/store/c2-gcc-wrapper"]}),
    "the stack's store path": ({}, {"python": "/nix/store/e2-dflash-env/bin/python"}),
    "dflashctl's store path": ({}, {"dflashctl": "/nix/store/d2-dflashctl/bin/dflashctl"}),
    "the settings file's store path": ({}, {"settingsFiles": {"a": "/nix/store/s2-dflash-a.json"}}),
    "an environment variable": ({}, {"nixos": {**ENTRY_CASE["nixos"], "environment": {"NCCL_DEBUG": "INFO"}}}),
    "systemd.globalEnvironment": ({}, {"nixos": {**ENTRY_CASE["nixos"],
                                                 "globalEnvironment": {**LOCALES, "TZDIR": "/nix/store/t1"}}}),
    "restartIfChanged": ({}, {"nixos": {**ENTRY_CASE["nixos"], "restartIfChanged": True}}),
}


def test_every_field_of_an_instances_unit_changes_its_digest():
    """nix/lib/service-unit.nix's entry over one instance, then the same with one field changed, for
    each field: every digest differs, and each is dflashctl's rule (unit.definition_digest) over the
    unit NixOS writes, as tests/nix_unit.py states NixOS's rule apart from nix/lib/service-entry.nix."""
    from dflashctl.service.unit import definition_digest
    base = {"a": {**QWEN, "gpus": [0]}}
    cases = [("nothing", {}, {}), ("nothing, again", {}, {})] + [(k, *v) for k, v in ENTRY_CHANGES.items()]
    results, _ = nix_unit.evaluate_many([
        {**ENTRY_CASE, **case, "instances": {"a": nix_unit.full_options("a", {**base["a"], **options})}}
        for _, options, case in cases])
    digests = {}
    for (what, _, case), result in zip(cases, results):
        assert result["failedAssertions"] == [], what
        got = result["units"]["a"]
        nixos = {**ENTRY_CASE, **case}["nixos"]
        path = {**ENTRY_CASE, **case}["path"]
        completed = {**got["entry"], "restartIfChanged": nixos["restartIfChanged"],
                     "environment": {"PATH": ":".join([f"{p}/bin" for p in path] + [f"{p}/sbin" for p in path]),
                                     **nixos["environment"]}}
        written = nix_unit.nixos_written(completed, nixos["globalEnvironment"])
        assert written == got["written"], what
        unit, digest = nix_unit.without_digest(written)
        assert digest == definition_digest(unit), what
        digests[what] = digest
    assert digests.pop("nothing, again") == digests["nothing"]
    assert len(set(digests.values())) == len(digests), digests


class SwitchedHost:
    """systemd on a host just switched from `old` to `new` units (tests/nix/harness/host-units.nix),
    its instances left running by the switch: each unit reports the new definition's digest, each
    main process carries the one it was started with (rollout_plan.freshness reads both)."""

    def __init__(self, old: dict, new: dict):
        self.old, self.new = old, new
        self.pids = {unit: pid for pid, unit in enumerate(sorted(new), start=100)}

    def show(self, unit: str):
        from dflashctl.service.instance_control import UnitState
        return UnitState(load="loaded", active="active", sub="running", result="success", exit_status=None,
                         status_text="", invocation="1", restarts=0, main_pid=self.pids[unit], need_reload=False,
                         digest=digest_of(self.new[unit]))

    def running_digest(self, state) -> str:
        [unit] = [u for u, pid in self.pids.items() if pid == state.main_pid]
        return digest_of(self.old[unit])


GLOBAL = {**LOCALES, "TZDIR": "/nix/store/t1/zoneinfo"}
# what changes: (the host's systemd definitions, packages' store paths, the instances it changes)
SWITCH_CHANGES = {
    "nothing": ({}, {}, set()),
    "a host's variable in a's unit": ({"services": {"dflash-a": {"environment": {"NCCL_DEBUG": "INFO"}}}}, {}, {"a"}),
    "a host's path in a's unit": ({"services": {"dflash-a": {"path": ["/opt/tools"]}}}, {}, {"a"}),
    "systemd.globalEnvironment (tzdata)": ({"globalEnvironment": {**GLOBAL, "TZDIR": "/nix/store/t2/zoneinfo"}}, {},
                                           {"a", "b"}),
    "the host compiler (path)": ({}, {"dflashHostCompiler": "/nix/store/c2-gcc-wrapper"}, {"a", "b"}),
    "the stack": ({}, {"dflash-env": "/nix/store/e2-dflash-env"}, {"a", "b"}),
}


@pytest.mark.parametrize("change", list(SWITCH_CHANGES))
def test_a_switch_that_changes_only_what_nixos_adds_is_rolled_out(change):
    """The module itself through nixos-lite (tests/nixos_host.py), upgrade = "rolling": a switch
    whose only change is something NixOS writes into an instance's unit beside the module's entry
    (PATH from `path`, a host's variable, systemd.globalEnvironment) or a package leaves the
    instances running and starts the rollout (tests/nixos_switch.py), and the rollout's own
    decision (rollout_plan.freshness) restarts exactly the instances whose unit changed."""
    import nixos_host
    import nixos_switch
    from dflashctl.operations import rollout_plan
    from dflashctl.service import config
    systemd, packages, changed = SWITCH_CHANGES[change]
    systemd = {"globalEnvironment": GLOBAL, **systemd}
    old = nixos_host.evaluate_host(nixos_host.host_config(TWO, {}, "rolling", systemd={"globalEnvironment": GLOBAL}))
    new = nixos_host.evaluate_host(nixos_host.host_config(TWO, {}, "rolling", systemd=systemd), packages)
    done = nixos_switch.switch(nixos_host.parsed(old), nixos_host.parsed(new), EVERYTHING - {"dflash-rollout.service"})
    assert done["dflash-a.service"] == done["dflash-b.service"] == "nothing"  # left running, either way
    assert done["dflash-rollout.service"] == "start"  # inactive between rollouts: every switch starts it
    decided = {n: rollout_plan.freshness(config.from_dict(TWO[n], n), SwitchedHost(old, new)) for n in TWO}
    assert {n for n, (needs, _) in decided.items() if needs} == changed, decided
    for n, (needs, why) in decided.items():
        assert why == ("runs an older definition of its unit" if needs else "runs its unit's current definition")
