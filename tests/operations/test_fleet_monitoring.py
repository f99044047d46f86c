"""`dflashctl monitoring --host NAME=ADDRESS --from DIR`: the fleet's Prometheus files from the hosts' own.

Each host's files are written by `dflashctl monitoring` itself (two hosts whose instances and router
have the same names and ports, as real hosts do); the fleet's files go through Debian's promtool:
`check config` and `check rules`, and `test rules` with two hosts' series: an alert fires for the
host whose series break the rule and names it, and every dashboard query, limited to one host,
returns that host's series only (a real Prometheus scraping three hosts: tests/operations/test_fleet.py).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import prometheus_or_skip

DFLASHCTL = [sys.executable, "-m", "dflashctl"]
HOSTS = {"gpu-a": "10.0.0.11", "gpu-b": "10.0.0.12"}


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*DFLASHCTL, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


def host_files(tmp: Path, alert_for: dict[str, str] | None = None) -> Path:
    (tmp / "a.json").write_text(json.dumps({"name": "a", "model": "m", "port": 30000, "draftModel": "d",
                                            "speculative": {"algorithm": "DFLASH"}}))
    (tmp / "router.json").write_text(json.dumps({"workers": ["http://127.0.0.1:30000"]}))
    for name in HOSTS:
        (tmp / "fleet" / name).mkdir(parents=True, exist_ok=True)
        extra = [f"--alert-for={k}={v}" for k, v in ((alert_for or {}).get(name) or {}).items()]
        r = run("monitoring", "--instance", "a.json", "--router", "router.json", "--gpu-exporter", "127.0.0.1:9400",
                "--scrape-config", f"fleet/{name}/scrape.json", "--rules", f"fleet/{name}/rules.json", *extra, cwd=tmp)
        assert r.returncode == 0, r.stderr
    return tmp


def fleet_files(tmp: Path) -> subprocess.CompletedProcess:
    return run("monitoring", *[f"--host={n}={a}" for n, a in HOSTS.items()], "--from", "fleet",
               "--scrape-config", "scrape.json", "--rules", "rules.json", "--dashboard", "dashboard.json", cwd=tmp)


@pytest.fixture
def fleet(tmp_path):
    host_files(tmp_path)
    r = fleet_files(tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path


def test_every_target_has_its_host_and_address_and_promtool_accepts_the_files(fleet):
    scrape = json.loads((fleet / "scrape.json").read_text())["scrape_configs"]
    assert [j["job_name"] for j in scrape] == ["dflash-instances", "dflash-router", "dflash-gpus"]
    for job in scrape:
        got = sorted((sc["labels"]["host"], t) for sc in job["static_configs"] for t in sc["targets"])
        port = {"dflash-instances": 30000, "dflash-router": 30081, "dflash-gpus": 9400}[job["job_name"]]
        assert got == [(n, f"{a}:{port}") for n, a in HOSTS.items()], job
    promtool = prometheus_or_skip() / "promtool"
    (fleet / "prometheus.json").write_text(json.dumps({"rule_files": ["rules.json"], "scrape_configs": scrape}))
    for argv in (["check", "config", "prometheus.json"], ["check", "rules", "rules.json"]):
        done = subprocess.run([str(promtool), *argv], cwd=fleet, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def series(host: str, text: str) -> str:
    """A series of `host` (the scrape's label added, as the fleet's scrape configuration adds it)."""
    return text.replace("{", '{host="%s",' % host, 1)


def render(text: str, labels: dict, value: str | None) -> str:
    """Go's template for the two forms the rules use: {{ $labels.NAME }} and {{ $value }}."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return out.replace("{{ $value }}", value) if value is not None else out


def alert_case(alert: str, inputs: list[tuple[str, str]], at: str, labels: dict, rules: dict,
               value: str | None = None) -> dict:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    full = {**rule["labels"], **labels}
    annotations = {k: render(v, full, value) for k, v in rule["annotations"].items()}
    assert not any("{{" in v for v in annotations.values()), annotations
    return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in inputs],
            "alert_rule_test": [{"eval_time": at, "alertname": alert,
                                 "exp_alerts": [{"exp_labels": full, "exp_annotations": annotations}]}]}


def test_an_alert_fires_for_the_host_whose_series_break_it_and_names_it(fleet):
    rules = json.loads((fleet / "rules.json").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        assert rule["annotations"]["summary"].startswith("{{ $labels.host }}: "), rule["alert"]
    accept = 'sglang:spec_accept_length{job="dflash-instances",dflash_instance="a",tp_rank="0"}'
    tokens = 'sglang:generation_tokens_total{job="dflash-instances",dflash_instance="a"}'
    health = 'smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30000"}'
    up = 'up{job="dflash-instances",dflash_instance="a",instance="%s:30000"}'
    tests = [  # the same instance name, worker URL and port on both hosts: only the host tells them apart
        alert_case("DflashAcceptanceLow", [(series("gpu-a", accept), "15.75x25"), (series("gpu-a", tokens), "0+600x25"),
                                           (series("gpu-b", accept), "15.75x4 1.25x20"),
                                           (series("gpu-b", tokens), "0+600x25")],
                   "16m", {"host": "gpu-b", "dflash_instance": "a"}, rules, "1.25"),
        alert_case("DflashRouterNoWorkers", [(series("gpu-a", health), "1 0x5"), (series("gpu-b", health), "1x6")],
                   "4m", {"host": "gpu-a"}, rules),
        alert_case("DflashRouterWorkerOutOfRotation", [(series("gpu-a", health), "1x8"),
                                                       (series("gpu-b", health), "1 1 0x6")],
                   "6m", {"host": "gpu-b", "worker": "http://127.0.0.1:30000"}, rules),
        alert_case("DflashInstanceDown", [(series("gpu-a", up % "10.0.0.11"), "1x6"),
                                          (series("gpu-b", up % "10.0.0.12"), "1 1 0x5")],
                   "5m", {"host": "gpu-b", "job": "dflash-instances", "dflash_instance": "a",
                          "instance": "10.0.0.12:30000"}, rules),
    ]
    (fleet / "tests.json").write_text(json.dumps({"rule_files": ["rules.json"], "evaluation_interval": "1m",
                                                  "tests": tests}))
    promtool = prometheus_or_skip() / "promtool"
    done = subprocess.run([str(promtool), "test", "rules", "tests.json"], cwd=fleet, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_dashboard_query_limited_to_one_host_returns_only_that_host(fleet):
    board = json.loads((fleet / "dashboard.json").read_text())
    names = [v["name"] for v in board["templating"]["list"]]
    assert names.index("host") < names.index("instance"), names
    assert 'host=~"$host"' in board["templating"]["list"][names.index("instance")]["query"]["query"]
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs and all(e.count("{") == e.count('{host=~"$host",') for e in exprs), exprs
    metrics = {  # one series per name each query reads, on both hosts
        'sglang:generation_tokens_total{job="dflash-instances",dflash_instance="a"}': "0+60x10",
        'sglang:spec_accept_length{job="dflash-instances",dflash_instance="a"}': "6x10",
        'dflash:threshold_accept_length_min{dflash_instance="a"}': "4x10",
        'sglang:num_running_reqs{job="dflash-instances",dflash_instance="a"}': "2x10",
        'sglang:num_queue_reqs{job="dflash-instances",dflash_instance="a"}': "1x10",
        'sglang:token_usage{job="dflash-instances",dflash_instance="a"}': "0.5x10",
        'smg_router_requests_total{job="dflash-router",endpoint="/generate"}': "0+60x10",
        'smg_worker_retries_total{job="dflash-router",endpoint="/generate"}': "0+1x10",
        'smg_http_responses_total{job="dflash-router",status_code="200"}': "0+60x10",
        'smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30000"}': "1x10",
    }
    for family in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        for le in ("0.1", "+Inf"):
            metrics[f'sglang:{family}_bucket{{job="dflash-instances",dflash_instance="a",le="{le}"}}'] = "0+10x10"
    inputs = [{"series": series(h, s), "values": v} for h in HOSTS for s, v in metrics.items()]
    tests = []  # each query limited to gpu-b: series of gpu-b, and of no other host
    for e in exprs:
        q = e.replace("$host", "gpu-b").replace("$instance", ".*").replace("$__rate_interval", "5m")
        tests.append({"expr": f"count by (host) ({q}) * 0 + 1", "eval_time": "8m",
                      "exp_samples": [{"labels": '{host="gpu-b"}', "value": 1}]})
    (fleet / "dashboard-tests.json").write_text(json.dumps({"rule_files": [], "evaluation_interval": "1m",
                                                            "tests": [{"interval": "1m", "input_series": inputs,
                                                                       "promql_expr_test": tests}]}))
    done = subprocess.run([str(prometheus_or_skip() / "promtool"), "test", "rules", "dashboard-tests.json"],
                          cwd=fleet, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hosts_whose_rules_differ_are_refused_and_bad_arguments_named(tmp_path):
    host_files(tmp_path, {"gpu-b": {"DflashAcceptanceLow": "30m"}})
    r = fleet_files(tmp_path)
    assert r.returncode == 78 and "gpu-b's alert rules differ from gpu-a's" in r.stderr, r.stderr
    assert not (tmp_path / "rules.json").exists() and not (tmp_path / "scrape.json").exists()
    r = run("monitoring", "--host", "gpu-a=10.0.0.11:9000", "--from", "fleet", "--rules", "x.json", cwd=tmp_path)
    assert r.returncode == 2 and "is not NAME=ADDRESS" in r.stderr, r.stderr
    r = run("monitoring", "--host", "gpu-z=10.0.0.19", "--from", "fleet", "--rules", "x.json", cwd=tmp_path)
    assert r.returncode == 66 and "gpu-z" in r.stderr and "fix:" in r.stderr, r.stderr
