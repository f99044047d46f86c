"""A fleet of three hosts upgraded by `ansible-playbook` through deploy/ansible's role, under load.

Three hosts are network namespaces on a bridge, each with sshd, its instances under the real
supervisor and the real router (tests/fleet_harness.py, tests/fleet_host.py). The fleet's serving
path is one router in front of every host's router (docs/fleet.md): clients send JSON /generate
to it from the machine, closed-loop, while `ansible-playbook deploy/ansible/playbook.yml` runs
`dflashctl upgrade` on one host after the other (serial: the first host alone, then one at a time).
Asserted: no request fails, the hosts roll one after the other in inventory order (from each
host's own record of its instances' restarts), and each host ends on the new build. Then a bad
build: the play stops on the first host with its name and the canary's figures, no request fails,
and the other two hosts never restart anything. Nothing is asserted about time; the runs' times
are printed (docs/benchmarks.md).
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflashctl.operations import upgrade_build
from conftest import prometheus_or_skip
from fleet_harness import REPO, Fleet, Prometheus, ansible_playbook, needs_fleet, pip_env, requirements
from rollout_harness import QUICK_CANARY
from router_harness import Load, Router, generate_body, needs_router

pytestmark = [needs_router, needs_fleet, pytest.mark.slow]

# What a host serves and how a bad build is caught: the rollout's canary, which judges greedy outputs,
# acceptance and speed by default (issue 40). The instances decode with DFLASH (the stand-in without a
# model pair commits the recording's 15.75 tokens a verify step, or the number in the file
# STANDIN_ACCEPT_LENGTH_FILE names); the bad build is one whose drafter accepts about one token a
# step, outputs unchanged (DFLASH is lossless): the likeliest bad build of this stack. The canary asks
# 32 tokens once and does not judge speed (stand-ins' 2 ms tokens on a loaded machine cannot decide it).
INSTANCES = {name: {"model": "standin-model", "draftModel": "standin-drafter", "port": port,
                    "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16},
                    "host": "0.0.0.0",  # the fleet's Prometheus scrapes it
                    "environment": {"STANDIN_READY_AFTER": "1.0", "STANDIN_TOKEN_DELAY": "0.002"}}
             for name, port in (("gpu0", 30000), ("gpu1", 30001))}
BAD_ACCEPT_LENGTH = "1.02"  # what the smoke's broken drafter accepted on the H200 (1.01-1.03)


ROLLOUT_ARGS = ["--healthy-for", "2", *QUICK_CANARY]
PLAYBOOK = REPO / "deploy" / "ansible" / "playbook.yml"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    bad_accept = tmp / "bad-build-accept-length"
    bad_accept.write_text(BAD_ACCEPT_LENGTH + "\n")
    bad_build = {"STANDIN_ACCEPT_LENGTH_FILE": str(bad_accept)}
    reqs = {tag: requirements(tmp, tag, b) for tag, b in (("v1", {}), ("v2", {}), ("bad", bad_build))}
    pip = pip_env(tmp)
    saved = {k: os.environ.get(k) for k in pip}
    os.environ.update(pip)

    def install(h):
        build = upgrade_build.pip_build(h.root, str(reqs["v1"]), None, sys._base_executable)
        upgrade_build.point_current(h.root, build.id)

    f = Fleet(tmp)
    front = None
    try:
        f.up(INSTANCES, dict(os.environ), install)
        front = Router({"workers": f.router_urls()}, tmp).start()
        front.wait_healthy(f.router_urls(), timeout=120)
        f.front, f.reqs, f.pip_env = front, reqs, pip
        yield f
    finally:
        if front is not None:
            front.stop()
        f.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def play(fleet: Fleet, build: str, tmp: Path, playbook: Path = PLAYBOOK,
         **more: object) -> tuple[subprocess.CompletedProcess, float]:
    """ansible-playbook over the three hosts with `build`'s requirements (and `more` inventory
    variables); (its result, seconds)."""
    common = {"dflash_instances": INSTANCES, "dflash_requirements": str(fleet.reqs[build]),
              "dflash_python": sys._base_executable, "dflash_dflashctl": str(BIN / "dflashctl"),
              "dflash_rollout_args": ROLLOUT_ARGS,
              "dflash_environment": {**fleet.pip_env, "TMPDIR": os.environ.get("TMPDIR", "/tmp")}, **more}
    return ansible_playbook(fleet, playbook, tmp, common)


def rolling_windows(fleet: Fleet, since: float) -> dict[str, tuple[float, float]]:
    """Per host that restarted anything after `since`: (its first instance exit, its last ready)."""
    out = {}
    for h in fleet.hosts:
        ev = [e for e in h.events() if e["t"] >= since]
        exits = [e["t"] for e in ev if e["event"].startswith("exit")]
        readies = [e["t"] for e in ev if e["event"] == "ready"]
        if exits:
            out[h.name] = (min(exits), max(readies) if readies else float("inf"))
    return out


def loaded(fleet: Fleet) -> Load:
    load = Load(fleet.front.url + "/generate", generate_body(16), clients=6, max_requests=10**7,
                seconds=900).start()
    assert load.wait_for(lambda o: len(o) >= 100, 60), "the fleet does not answer before the upgrade"
    return load


def settle(load: Load) -> list:
    after = load.count()
    assert load.wait_for(lambda o: len(o) >= after + 100, 60), "the fleet does not answer after the upgrade"
    return load.stop()


def test_the_fleet_upgrades_host_by_host_and_answers_every_request(fleet, tmp_path):
    starts_before = {h.name: h.starts() for h in fleet.hosts}
    load = loaded(fleet)
    since = time.monotonic()
    r, seconds = play(fleet, "v2", tmp_path)
    outcomes = settle(load)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    failed = [o for o in outcomes if o.status != 200]
    assert failed == [], failed[:3]
    v2 = upgrade_build.pip_build  # the build id is the digest of its inputs: the same call names it
    for h in fleet.hosts:
        assert h.starts() == {n: starts_before[h.name][n] + 1 for n in INSTANCES}, (h.name, h.events())
        built = v2(h.root, str(fleet.reqs["v2"]), None, sys._base_executable)
        assert not built.installed and upgrade_build.current(h.root) == built.id, h.name
    windows = rolling_windows(fleet, since)
    order = sorted(windows, key=lambda n: windows[n][0])
    assert order == [h.name for h in fleet.hosts], windows  # the inventory's order: host1 is the canary host
    spans = [windows[n] for n in order]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans  # never two hosts rolling at once
    for h in fleet.hosts:  # the role's last task, per host
        assert f'"msg": "{h.name}: serving build {upgrade_build.current(h.root)} on every instance"' in r.stdout
    print(f"fleet upgrade: 3 hosts x {len(INSTANCES)} instances in {seconds:.1f} s (ansible-playbook), "
          f"{len(outcomes)} requests through the front router, {len(failed)} failed")


def test_a_bad_build_stops_on_the_first_host_and_the_others_are_never_touched(fleet, tmp_path):
    before = {h.name: (h.starts(), upgrade_build.current(h.root)) for h in fleet.hosts}
    load = loaded(fleet)
    r, seconds = play(fleet, "bad", tmp_path)
    outcomes = settle(load)
    assert r.returncode != 0, r.stdout[-4000:]
    failed = [o for o in outcomes if o.status != 200]
    assert failed == [], failed[:3]
    first, *others = fleet.hosts
    for h in others:  # never reached: no restart, still on the build they had
        assert (h.starts(), upgrade_build.current(h.root)) == before[h.name], h.name
        assert f"ok: [{h.name}]" not in r.stdout and f"changed: [{h.name}]" not in r.stdout, r.stdout[-3000:]
    starts = first.starts()
    # the canary instance: restarted onto the bad build, then reverted onto the old one (upgrade's revert)
    assert starts["gpu0"] == before[first.name][0]["gpu0"] + 2
    assert starts["gpu1"] == before[first.name][0]["gpu1"]  # the other one never restarted
    assert upgrade_build.current(first.root) == before[first.name][1]  # current points back at the old build
    assert "fatal: [host1]" in r.stdout, r.stdout[-3000:]
    message = r.stdout[r.stdout.index("fatal: [host1]"):]
    assert "host1: upgrade to build" in message and "stopped at instance gpu0" in message, message[:2000]
    # the canary's figures: about 16 tokens a step before, about 1 after (0.06x)
    assert "canary: failed" in message and re.search(r"accept 1[56](\.\d+)? -> 1(\.\d+)? \(0\.0\dx", message), \
        message[:2000]
    assert "outputs identical" in message, message[:2000]
    assert "reverted gpu0 to the build still serving" in message, message[:2000]  # and back in rotation
    print(f"bad build: stopped on host1 after {seconds:.1f} s, {len(outcomes)} requests, {len(failed)} failed; "
          f"host2 and host3 untouched")


def test_one_prometheus_scrapes_every_host_with_its_label(fleet, tmp_path):
    """deploy/ansible/monitoring.yml gathers each host's own monitoring files and makes the fleet's;
    a real Prometheus scrapes the three hosts with them: every series has its host, and a dashboard
    query limited to one host shows that host only."""
    prom_dir = prometheus_or_skip()
    own = tmp_path / "fleet"
    r, _ = play(fleet, "v2", tmp_path, REPO / "deploy" / "ansible" / "monitoring.yml", dflash_monitoring_dir=str(own),
                dflash_monitoring_args=["--scrape-interval", "1"], dflash_controller_dflashctl=str(BIN / "dflashctl"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert sorted(p.name for p in own.iterdir() if p.is_dir()) == [h.name for h in fleet.hosts]
    prom = Prometheus(prom_dir, own, json.loads((own / "fleet-scrape.json").read_text())["scrape_configs"],
                      "fleet-rules.json").start()
    try:
        want = {(h.name, job): n for h in fleet.hosts for job, n in (("dflash-instances", 2), ("dflash-router", 1))}
        got = prom.until(lambda: {(s["metric"]["host"], s["metric"]["job"]): int(float(s["value"][1]))
                                  for s in prom.query("count by (host, job) (up == 1)")}, want)
        assert got == want
        records = prom.query("count by (host) (dflash:threshold_ttft_p99_seconds)")
        assert sorted((s["metric"]["host"], s["value"][1]) for s in records) == [(h.name, "2") for h in fleet.hosts]
        board = json.loads((own / "fleet-dashboard.json").read_text())
        expr = next(t["expr"] for p in board["panels"] for t in p.get("targets", [])
                    if "sglang:num_running_reqs" in t["expr"])
        one = prom.query(expr.replace("$host", "host2").replace("$instance", ".*"))
        assert sorted(s["metric"]["dflash_instance"] for s in one) == sorted(INSTANCES), one
        assert {s["metric"]["host"] for s in one} == {"host2"}
    finally:
        prom.stop()
