"""The GPU alert rules and the GPU health facts agree (operations/gpu_alerts.py over
host/data/gpu-health.json): the XID and throttling alerts are the generated ones, the hand-written
ECC and row-remap alerts page (critical) exactly where a serving instance ends, and a new XID
verdict moves between the two XID alerts. promtool runs every alert in test_monitoring.py.
"""

import copy
import json

import pytest

from dflashctl.host import gpu_health_data
from dflashctl.operations import gpu_alerts, monitoring

# GPU alerts about memory, not health: gpu_claim's concern (an instance that cannot get its memory)
NOT_HEALTH = {"DflashGpuMemoryFullDcgm", "DflashGpuMemoryFullNvidiaSmi"}


def rules_by_name(rules: dict) -> dict:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_the_rule_file_holds_the_generated_gpu_alerts():
    rules = json.loads(gpu_alerts.RULES_FILE.read_text())
    assert gpu_alerts.with_generated(rules, gpu_health_data.load()) == rules, \
        "dflash.rules.json's GPU alerts are stale: run tests/regenerate (or python -m dflashctl.operations.gpu_alerts)"
    assert gpu_alerts.RULES_FILE == monitoring.RULES_FILE  # the file `dflashctl monitoring` and the module read


def test_every_gpu_alert_follows_the_health_data():
    """Generated, or named by the finding it alerts on with critical exactly where the watch ends a
    serving instance; only the memory alerts are neither."""
    d = gpu_health_data.load()
    rules = rules_by_name(monitoring.alert_rules())
    made = {r["alert"] for rs in gpu_alerts.generated(d).values() for r in rs}
    named = {a: f for f in d.data["findings"].values() for a in f.get("alerts", [])}
    gpu = {name for name, r in rules.items() if "exporter" in r["labels"]}
    assert gpu - made - set(named) == NOT_HEALTH
    assert set(named) <= gpu  # no finding names an alert that is gone
    for name in set(named) - made:
        want = "critical" if named[name]["serving"] == "fail" else "warning"
        assert rules[name]["labels"]["severity"] == want, name


def test_the_xid_alerts_split_by_verdict():
    rules = rules_by_name(monitoring.alert_rules())
    assert rules["DflashGpuXidFailedDcgm"]["labels"]["severity"] == "critical"
    assert rules["DflashGpuXidDcgm"]["labels"]["severity"] == "warning"
    # 48 pages, 63 does not (issue 41: the rules called 63 a reset case while serve served on)
    assert "DCGM_FI_DEV_XID_ERRORS == 48" in rules["DflashGpuXidFailedDcgm"]["expr"]
    assert "== 63" not in rules["DflashGpuXidFailedDcgm"]["expr"]
    assert "63 a row remap" in rules["DflashGpuXidDcgm"]["annotations"]["description"]
    assert 'xid=~"48|62|64|74|79|94|95|119|120|154"' in rules["DflashGpuXidFailedNvidiaSmi"]["expr"]
    assert 'xid!~"48|62|64|74|79|94|95|119|120|154"' in rules["DflashGpuXidNvidiaSmi"]["expr"]


def test_a_new_xid_verdict_moves_it_between_the_alerts():
    data = copy.deepcopy(json.loads(gpu_health_data.DATA_FILE.read_text()))
    data["xids"].append({"xid": 200, "verdict": "fail", "what": "a throw-away failure", "fix": "{reset}",
                         "reason": "a test's"})
    made = {r["alert"]: r for rs in gpu_alerts.generated(gpu_health_data.from_data(data)).values() for r in rs}
    assert made["DflashGpuXidFailedDcgm"]["expr"].endswith("DCGM_FI_DEV_XID_ERRORS == 200")
    assert made["DflashGpuXidDcgm"]["expr"].endswith("DCGM_FI_DEV_XID_ERRORS == 200)")  # excluded there
    assert '|154|200"' in made["DflashGpuXidFailedNvidiaSmi"]["expr"]
    assert "200 a throw-away failure" in made["DflashGpuXidFailedNvidiaSmi"]["annotations"]["description"]
    assert "XID 200: drain it, then `nvidia-smi -r -i {{ $labels.gpu }}` (root)" not in \
        made["DflashGpuXidFailedDcgm"]["annotations"]["action"]  # grouped with the XIDs of the same fix
    assert "XID 48, 94, 95 or 200: drain it, then `nvidia-smi -r -i {{ $labels.gpu }}` (root)" in \
        made["DflashGpuXidFailedDcgm"]["annotations"]["action"]


def test_the_generator_rewrites_the_rule_file_in_place(tmp_path, monkeypatch, capsys):
    stale = json.loads(gpu_alerts.RULES_FILE.read_text())
    for g in stale["groups"]:  # as before the split: no critical XID alert, the old expression
        g["rules"] = [r for r in g["rules"] if "XidFailed" not in r.get("alert", "")]
        for r in g["rules"]:
            if r.get("alert") == "DflashGpuXidDcgm":
                r["expr"] = "DCGM_FI_DEV_XID_ERRORS > 0"
    path = tmp_path / "dflash.rules.json"
    path.write_text(json.dumps(stale, indent=2) + "\n")
    monkeypatch.setattr(gpu_alerts, "RULES_FILE", path)
    assert gpu_alerts.main([]) == 0
    assert path.read_text() == monitoring.RULES_FILE.read_text()
    dcgm = next(g for g in json.loads(path.read_text())["groups"] if g["name"] == gpu_alerts.GROUPS["dcgm-exporter"])
    names = [r["alert"] for r in dcgm["rules"]]
    assert names[:2] == ["DflashGpuXidFailedDcgm", "DflashGpuXidDcgm"]  # added before the one it splits
    assert gpu_alerts.main(["x"]) == 2 and "usage" in capsys.readouterr().err


@pytest.mark.parametrize("exporter", sorted(gpu_alerts.EXPORTERS))
def test_the_throttling_alert_reads_the_bits_that_warn(exporter):
    d = gpu_health_data.load()
    rule = next(r for r in gpu_alerts.generated(d)[gpu_alerts.GROUPS[exporter]] if "Throttled" in r["alert"])
    host = [r for r in d.data["clockReasons"] if "fix" in r]
    assert [r["bit"] for r in host] == [0x8, 0x20, 0x40, 0x80]  # nvml.h's slowdowns; idle and power cap are not
    if exporter == "dcgm-exporter":
        assert all(f"/ {r['bit']}) % 2" in rule["expr"] for r in host) and "/ 4)" not in rule["expr"]
    else:
        assert all(r["name"] in rule["expr"] for r in host) and "sw_power_cap" not in rule["expr"]
    assert rule["for"] == "10m" and rule["labels"] == {"severity": "warning", "exporter": exporter}
