"""The host's instances, found one way: `dflashctl status`, `monitoring` and `rollout` see the same ones.

The defaults are absolute paths (/etc/dflash/*.json, /etc/dflash-instances.json); here they point
into the test's directory, and the three commands run in this process as a user runs them.
"""

import json

import pytest
from dflashctl import cli
from dflashctl.errors import CONFIG, DflashError
from dflashctl.operations import instances


@pytest.fixture
def etc(tmp_path, monkeypatch):
    """One instance as `dflashctl unit` installs it, two in the NixOS module's file."""
    (tmp_path / "dflash").mkdir()
    (tmp_path / "dflash" / "a.json").write_text(json.dumps({"name": "a", "model": "m", "port": 30100, "gpus": [0]}))
    module = {"instances": {"b": {"model": "m", "port": 30101, "gpus": [1]},
                            "c": {"model": "m", "port": 30102, "gpus": [2]}}}
    (tmp_path / "dflash-instances.json").write_text(json.dumps(module))
    monkeypatch.setattr(instances, "SETTINGS_GLOB", str(tmp_path / "dflash" / "*.json"))
    monkeypatch.setattr(instances, "MODULE_SETTINGS", str(tmp_path / "dflash-instances.json"))
    return tmp_path


def seen_by_each(tmp_path, capsys, *given: str) -> dict[str, list[str]]:
    """The instances status, monitoring and rollout (a dry run) act on, as each reports them."""
    out = {}
    rc = cli.main(["status", "--json", "--window", "0", "--no-router", "--no-systemd", "--state-dir",
                   str(tmp_path / "state"), *given])
    assert rc in (0, 1)
    out["status"] = [r["name"] for r in json.loads(capsys.readouterr().out)["instances"]]
    scrape = tmp_path / "scrape.json"
    assert cli.main(["monitoring", "--no-router", "--scrape-config", str(scrape), *given]) == 0
    jobs = json.loads(scrape.read_text())["scrape_configs"]
    out["monitoring"] = [g["labels"]["dflash_instance"] for j in jobs for g in j["static_configs"]]
    capsys.readouterr()
    assert cli.main(["rollout", "--dry-run", "--json", "--no-router", "--restart-command", "true {name}",
                     "--state-dir", str(tmp_path / "state"), *given]) == 0
    out["rollout"] = [r["name"] for r in json.loads(capsys.readouterr().out)["instances"]]
    return out


def test_status_monitoring_and_rollout_find_the_same_instances(etc, capsys):
    assert seen_by_each(etc, capsys) == {c: ["a", "b", "c"] for c in ("status", "monitoring", "rollout")}
    given = ["--instance", str(etc / "dflash-instances.json")]
    assert seen_by_each(etc, capsys, *given) == {c: ["b", "c"] for c in ("status", "monitoring", "rollout")}


def test_a_host_without_instances_is_refused_alike(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(instances, "SETTINGS_GLOB", str(tmp_path / "none" / "*.json"))
    monkeypatch.setattr(instances, "MODULE_SETTINGS", str(tmp_path / "none.json"))
    for argv in (["status", "--no-router"], ["monitoring", "--no-router", "--rules", str(tmp_path / "r.json")],
                 ["rollout", "--dry-run", "--no-router", "--restart-command", "true {name}"]):
        assert cli.main(argv) == CONFIG
        err = capsys.readouterr().err
        assert "no instances on this host" in err and "none.json" in err and "--instance FILE" in err
    assert not (tmp_path / "r.json").exists()


def test_an_instance_in_both_places_is_refused(etc):
    (etc / "dflash" / "b.json").write_text(json.dumps({"name": "b", "model": "m", "port": 30101, "gpus": [1]}))
    with pytest.raises(DflashError, match="an instance is given twice"):
        instances.load([])
