"""The host's monitoring: alert rules through promtool, the NixOS module's twin of `dflashctl
monitoring`, and a real Prometheus over the real router and stand-in workers.

Prometheus and promtool are Debian's (tests/run unpacks the package; a failure there, a skip
elsewhere). The stand-ins serve SGLang 0.5.11's /metrics from the H200 recording
(tests/data/service/standin_metrics.py); their acceptance length is a file the test lowers. Time is
short only where the rule files parametrise it: the live Prometheus scrapes every second and gets
the rules with a few seconds of `for:` (service/monitoring.rule_file's `alert_for`, what
services.dflash.prometheus.alertFor sets); the real durations are checked by `promtool test rules`.
"""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, nix_or_skip, prometheus_or_skip
from dflashctl import cli
from dflashctl.operations import monitoring, promcheck, router
from dflashctl.operations.metrics_text import parse
from dflashctl.service import config
from nixeval import nix_env
from router_harness import ENV, HAVE_ROUTER, STANDIN, Load, Router, Standin, free_port, generate_body, request

MONITORING_LIB = REPO / "nix" / "lib" / "monitoring.nix"


def instance(name: str, **extra) -> config.InstanceConfig:
    return config.from_dict({"name": name, "model": "m", **extra})


# ------------------------------------------------------------------------------ promtool: the rules

HOST = [instance("a", draftModel="d", speculative={"algorithm": "DFLASH"}, port=30000),
        instance("b", draftModel="d", speculative={"algorithm": "DFLASH"}, port=30001),
        instance("p", port=30002)]

G = 'job="dflash-gpus",instance="127.0.0.1:9400"'
CASES = [  # (alert, input series, times it must not fire, time it fires, the labels it fires with, $value)
    ("DflashInstanceDown",
     [('up{job="dflash-instances",dflash_instance="a",instance="127.0.0.1:30000"}', "1 1 0x5")],
     ["1m", "3m"], "4m", [{"job": "dflash-instances", "dflash_instance": "a", "instance": "127.0.0.1:30000"}], None),
    # a: decoding while its acceptance falls to 1.25 at 5m; b: as low, but idle; p: plain (no threshold)
    ("DflashAcceptanceLow",
     [('sglang:spec_accept_length{job="dflash-instances",dflash_instance="a",tp_rank="0"}', "15.75x4 1.25x20"),
      ('sglang:generation_tokens_total{job="dflash-instances",dflash_instance="a"}', "0+600x25"),
      ('sglang:spec_accept_length{job="dflash-instances",dflash_instance="b",tp_rank="0"}', "1.25x25"),
      ('sglang:generation_tokens_total{job="dflash-instances",dflash_instance="b"}', "500x25"),
      ('sglang:spec_accept_length{job="dflash-instances",dflash_instance="p",tp_rank="0"}', "0x25"),
      ('sglang:generation_tokens_total{job="dflash-instances",dflash_instance="p"}', "0+600x25")],
     ["4m", "14m"], "16m", [{"dflash_instance": "a"}], "1.25"),
    # p99 near 20 s from 1m on (threshold 10 s), for 10 minutes
    ("DflashTimeToFirstTokenHigh",
     [('sglang:time_to_first_token_seconds_bucket{job="dflash-instances",dflash_instance="a",le="10"}', "0x14"),
      ('sglang:time_to_first_token_seconds_bucket{job="dflash-instances",dflash_instance="a",le="20"}', "0+10x14"),
      ('sglang:time_to_first_token_seconds_bucket{job="dflash-instances",dflash_instance="a",le="+Inf"}', "0+10x14"),
      ('sglang:time_to_first_token_seconds_bucket{job="dflash-instances",dflash_instance="b",le="10"}', "0+10x14"),
      ('sglang:time_to_first_token_seconds_bucket{job="dflash-instances",dflash_instance="b",le="+Inf"}', "0+10x14")],
     ["10m"], "12m", [{"dflash_instance": "a"}], None),
    # a: one more request waiting each minute from 2m on; b: a queue that empties every few minutes
    ("DflashQueueGrowing",
     [('sglang:num_queue_reqs{job="dflash-instances",dflash_instance="a"}', "0 0 1+1x20"),
      ('sglang:num_queue_reqs{job="dflash-instances",dflash_instance="b"}', "0 5 9 0 5 9 0 5 9 0 5 9 0 5 9 0 5 9 0 5 9")],
     ["10m", "15m"], "17m", [{"dflash_instance": "a"}], "6"),
    ("DflashRouterDown", [('up{job="dflash-router",instance="127.0.0.1:30081"}', "1 0x5")],
     ["2m"], "4m", [{"job": "dflash-router", "instance": "127.0.0.1:30081"}], None),
    ("DflashRouterWorkerOutOfRotation",
     [('smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30000"}', "1x8"),
      ('smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30001"}', "1 1 0x6")],
     ["4m"], "6m", [{"worker": "http://127.0.0.1:30001"}], None),
    ("DflashRouterNoWorkers",
     [('smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30000"}', "1 0x5"),
      ('smg_worker_health{job="dflash-router",worker="http://127.0.0.1:30001"}', "1 1 0x4")],
     ["2m"], "4m", [{}], None),
    # GPU 0 raises an XID it serves on (63), GPU 1 one that means it failed (48): each alert sees its own
    ("DflashGpuXidDcgm", [(f'DCGM_FI_DEV_XID_ERRORS{{{G},gpu="0",UUID="GPU-0"}}', "0 0 63x3"),
                          (f'DCGM_FI_DEV_XID_ERRORS{{{G},gpu="1",UUID="GPU-1"}}', "0 0 48x3")],
     ["1m"], "3m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "0", "UUID": "GPU-0"}], "63"),
    ("DflashGpuXidFailedDcgm", [(f'DCGM_FI_DEV_XID_ERRORS{{{G},gpu="0",UUID="GPU-0"}}', "0 0 63x3"),
                                (f'DCGM_FI_DEV_XID_ERRORS{{{G},gpu="1",UUID="GPU-1"}}', "0 0 48x3")],
     ["1m"], "3m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "1", "UUID": "GPU-1"}], "48"),
    ("DflashGpuEccUncorrectableDcgm", [(f'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G},gpu="1",UUID="GPU-1"}}', "0 0 2x3")],
     ["1m"], "3m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "1", "UUID": "GPU-1"}], "2"),
    ("DflashGpuRowRemapFailedDcgm", [(f'DCGM_FI_DEV_ROW_REMAP_FAILURE{{{G},gpu="0",UUID="GPU-0"}}', "0 1x3")],
     ["0m"], "2m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "0", "UUID": "GPU-0"}], None),
    ("DflashGpuRowsRemappedDcgm",
     [(f'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{G},gpu="0",UUID="GPU-0"}}', "0 0 5x3")],
     ["1m"], "3m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "0", "UUID": "GPU-0"}], "5"),
    # GPU 0: idle + hardware thermal slowdown (0x41) from 3m; GPU 1: idle + software power cap (0x5),
    # not a slowdown this rule names; GPU 2: hardware slowdown under DCGM's name before 3.3
    ("DflashGpuThrottledDcgm",
     [(f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{G},gpu="0",UUID="GPU-0"}}', "1x2 65x15"),
      (f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{G},gpu="1",UUID="GPU-1"}}', "5x17"),
      (f'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{G},gpu="2",UUID="GPU-2"}}', "0 0 8x15")],
     ["11m"], "13m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "0", "UUID": "GPU-0"},
                      {"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "2", "UUID": "GPU-2"}], None),
    ("DflashGpuMemoryFullDcgm",
     [(f'DCGM_FI_DEV_FB_FREE{{{G},gpu="0",UUID="GPU-0"}}', "40000x2 100x12"),
      (f'DCGM_FI_DEV_FB_USED{{{G},gpu="0",UUID="GPU-0"}}', "100000x2 139900x12")],
     ["11m"], "13m", [{"job": "dflash-gpus", "instance": "127.0.0.1:9400", "gpu": "0", "UUID": "GPU-0"}], None),
    # the exporter received XID 13 from GPU-0 and XID 79 from GPU-1 at 130 s (the test's clock starts at 0)
    ("DflashGpuXidNvidiaSmi",
     [('nvidia_smi_xid_last_timestamp_seconds{job="dflash-gpus",uuid="GPU-0",xid="13"}', "_ _ 130x20"),
      ('nvidia_smi_xid_last_timestamp_seconds{job="dflash-gpus",uuid="GPU-1",xid="79"}', "_ _ 130x20")],
     ["1m", "18m"], "3m", [{"job": "dflash-gpus", "uuid": "GPU-0", "xid": "13"}], None),
    ("DflashGpuXidFailedNvidiaSmi",
     [('nvidia_smi_xid_last_timestamp_seconds{job="dflash-gpus",uuid="GPU-0",xid="13"}', "_ _ 130x20"),
      ('nvidia_smi_xid_last_timestamp_seconds{job="dflash-gpus",uuid="GPU-1",xid="79"}', "_ _ 130x20")],
     ["1m", "18m"], "3m", [{"job": "dflash-gpus", "uuid": "GPU-1", "xid": "79"}], None),
    ("DflashGpuEccUncorrectableNvidiaSmi",
     [('nvidia_smi_ecc_errors_uncorrected_volatile_total{job="dflash-gpus",uuid="GPU-0"}', "0 0 3x3")],
     ["1m"], "3m", [{"job": "dflash-gpus", "uuid": "GPU-0"}], "3"),
    ("DflashGpuRowRemapFailedNvidiaSmi",
     [('nvidia_smi_remapped_rows_failure{job="dflash-gpus",uuid="GPU-0"}', "0 1x3")],
     ["0m"], "2m", [{"job": "dflash-gpus", "uuid": "GPU-0"}], None),
    ("DflashGpuRowRemapPendingNvidiaSmi",
     [('nvidia_smi_remapped_rows_pending{job="dflash-gpus",uuid="GPU-0"}', "0 1x3")],
     ["0m"], "2m", [{"job": "dflash-gpus", "uuid": "GPU-0"}], None),
    ("DflashGpuThrottledNvidiaSmi",
     [('nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{job="dflash-gpus",uuid="GPU-0"}', "0 0 1x13"),
      ('nvidia_smi_clocks_event_reasons_gpu_idle{job="dflash-gpus",uuid="GPU-1"}', "1x15")],
     ["11m"], "13m", [{"uuid": "GPU-0"}], None),
    ("DflashGpuMemoryFullNvidiaSmi",
     [('nvidia_smi_memory_free_bytes{job="dflash-gpus",uuid="GPU-0"}', "4e10x2 1e8x12"),
      ('nvidia_smi_memory_total_bytes{job="dflash-gpus",uuid="GPU-0"}', "1.4e11x14")],
     ["11m"], "13m", [{"job": "dflash-gpus", "uuid": "GPU-0"}], None),
]


def _render(text: str, labels: dict, value: str | None) -> str:
    """Go's template for the two forms the rules use: {{ $labels.NAME }} and {{ $value }}."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    if value is not None:
        out = out.replace("{{ $value }}", value)
    assert "{{" not in out, f"a template form this test does not render: {out}"
    return out


def _rules_by_name() -> dict:
    return {r["alert"]: r for g in monitoring.alert_rules()["groups"] for r in g["rules"] if "alert" in r}


def promtool_tests() -> dict:
    """promtool's unit-test file: each case in its own group, at the rule file's own `for:`."""
    rules, tests = _rules_by_name(), []
    for alert, series, quiet, fires, labels, value in CASES:
        rule = rules[alert]
        expected = []
        for extra in labels:
            full = {**rule["labels"], **extra}
            expected.append({"exp_labels": full, "exp_annotations": {
                k: _render(v, full, value) for k, v in rule["annotations"].items()}})
        checks = [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in quiet]
        checks.append({"eval_time": fires, "alertname": alert, "exp_alerts": expected})
        tests.append({"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                      "alert_rule_test": checks})
    return {"rule_files": ["dflash.rules.json"], "evaluation_interval": "1m", "tests": tests}


def test_every_alert_has_a_promtool_case_and_says_what_to_do():
    names = monitoring.alert_names()
    assert sorted(c[0] for c in CASES) == sorted(names) and len(set(names)) == len(names)
    for name, rule in _rules_by_name().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert {"summary", "description", "action"} <= set(rule["annotations"]), name
        if "Gpu" in name:  # which exporter's metric names the rule reads
            assert rule["labels"]["exporter"] in ("dcgm-exporter", "nvidia_gpu_exporter"), name


def test_rule_files_pass_promtool_check(tmp_path):
    promtool = prometheus_or_skip() / "promtool"
    host = tmp_path / "host.rules.json"
    host.write_text(json.dumps(monitoring.rule_file(HOST, min_accept={"b": 3.5}, alert_for={"DflashAcceptanceLow": "30m"})))
    done = subprocess.run([str(promtool), "check", "rules", str(monitoring.RULES_FILE), str(host)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(monitoring.alert_names())} rules found" in done.stdout
    assert f"SUCCESS: {len(monitoring.alert_names()) + 5} rules found" in done.stdout  # + a's, b's, p's thresholds


def test_promtool_unit_tests_every_alert_at_its_own_duration(tmp_path):
    promtool = prometheus_or_skip() / "promtool"
    (tmp_path / "dflash.rules.json").write_text(json.dumps(monitoring.rule_file(HOST)))
    (tmp_path / "tests.json").write_text(json.dumps(promtool_tests(), indent=1))
    done = subprocess.run([str(promtool), "test", "rules", "tests.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "SUCCESS" in done.stdout


def test_promtool_would_see_a_broken_rule(tmp_path):
    """The control: the same harness fails when an alert fires at another time than the case says."""
    promtool = prometheus_or_skip() / "promtool"
    (tmp_path / "dflash.rules.json").write_text(json.dumps(monitoring.rule_file(HOST, alert_for={"DflashInstanceDown": "5m"})))
    (tmp_path / "tests.json").write_text(json.dumps(promtool_tests()))
    done = subprocess.run([str(promtool), "test", "rules", "tests.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "alertname: DflashInstanceDown, time: 4m" in done.stderr


# ------------------------------------------------- the names: every query against what the exporters write

METRICS = REPO / "tests" / "data" / "metrics"
# What the real exporters wrote: a DFLASH instance and sglang-router 0.3.2 on the H200, and the same
# router on loopback after a worker was killed under load (tests/data/metrics/loopback/record_router.py:
# the families that appear only with retries and failures).
RECORDINGS = [METRICS / "h200" / "instance-metrics.txt", METRICS / "h200" / "router-metrics.txt",
              METRICS / "loopback" / "router-after-kill-metrics.txt"]
TARGET_LABELS = {"job", "instance", "dflash_instance"}  # what Prometheus and the scrape configs attach
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}
GPU_PREFIXES = {"dcgm-exporter": "DCGM_FI_", "nvidia_gpu_exporter": "nvidia_smi_"}


def recorded_families() -> dict[str, tuple[str, set[str]]]:
    """{family: (type, label names)} over the recordings (histogram and summary parts folded in)."""
    types, labels = {}, {}
    for path in RECORDINGS:
        text = path.read_text()
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                types[name] = kind
        for sample in parse(text):
            fam = sample.name
            for suffix in ("_bucket", "_sum", "_count"):
                if fam not in types and fam.endswith(suffix) and fam[: -len(suffix)] in types:
                    fam = fam[: -len(suffix)]
            labels.setdefault(fam, set()).update(k for k, _ in sample.labels if k not in ("le", "quantile"))
    out = {name: (kind, labels.get(name, set())) for name, kind in types.items()}
    # Observed only for streamed requests, so not in the H200 recording (its requests were not
    # streamed): SGLang 0.5.11's observability/metrics_collector.py declares it beside the time to
    # first token, with the same label names (`labelnames=labels.keys()` for both).
    out["sglang:inter_token_latency_seconds"] = ("histogram", out["sglang:time_to_first_token_seconds"][1])
    return out


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """Every series selector of a PromQL expression: (metric name or `{__name__=~...}`'s regex, matchers)."""
    found, bare = [], expr
    for m in re.finditer(r'([a-zA-Z_:][\w:]*)?\{([^}]*)\}', expr):
        matchers = dict((k, v) for k, _, v in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)"', m.group(2)))
        found.append((m.group(1) or matchers.pop("__name__"), matchers))
    bare = re.sub(r'[a-zA-Z_:][\w:]*\{[^}]*\}|\{[^}]*\}|\[[^\]]*\]|"[^"]*"', " ", expr)
    bare = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', " ", bare)
    for m in re.finditer(r'(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()', bare):
        if m.group(1) not in PROMQL_WORDS:
            found.append((m.group(1), {}))
    return found


def grouping_labels(expr: str) -> set[str]:
    return {x.strip() for g in re.findall(r'\b(?:by|without|on|ignoring)\s*\(([^)]*)\)', expr) for x in g.split(",")
            if x.strip()}


def family_of(name: str, families: dict) -> tuple[str, str] | None:
    """(family, the part of it `name` is: "" or _bucket/_sum/_count), or None when no exporter writes it."""
    if name in families:
        return name, ""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and families.get(name[: -len(suffix)], ("",))[0] in ("histogram", "summary"):
            return name[: -len(suffix)], suffix
    return None


def query_problems(expr: str, families: dict, records: dict[str, set[str]]) -> list[str]:
    """What in `expr` no exporter writes: a metric name, a label a selector or a grouping names, a
    rate over a gauge, a quantile over anything but a histogram's buckets."""
    problems, seen_labels = [], set(TARGET_LABELS)
    for name, matchers in selectors(expr):
        if name in ("up", "ALERTS"):  # Prometheus' own: up per target, ALERTS per alert
            if seen_labels is not None:
                seen_labels |= {"alertname", "alertstate"}
            continue
        if name in records:
            labels = records[name]
        elif (fam := family_of(name, families)) is not None:
            kind, labels = families[fam[0]]
            labels = labels | ({"le"} if fam[1] == "_bucket" else set())
        elif any(name.startswith(p) for p in GPU_PREFIXES.values()):
            seen_labels = None  # the GPU exporters' (no recording: their labels unknown here), named by
            continue  # the rule's exporter label (the rule test below)
        else:
            problems.append(f"{name}: no recording has it")
            continue
        if seen_labels is not None:
            seen_labels |= labels
        for label in set(matchers) - TARGET_LABELS - labels:
            problems.append(f"{name}{{{label}}}: the series have no label {label}")
    for label in grouping_labels(expr) - (seen_labels if seen_labels is not None else grouping_labels(expr)):
        problems.append(f"grouped by {label}, which none of its series has")
    for func, name in re.findall(r'\b(rate|irate|increase|delta)\(\s*([a-zA-Z_:][\w:]*)', expr):
        fam = family_of(name, families)
        if fam is None:
            continue
        counts = families[fam[0]][0] == "counter" or fam[1] in ("_bucket", "_sum", "_count")
        if counts != (func != "delta"):
            problems.append(f"{func}({name}): {name} is a {families[fam[0]][0]}")
    for name in re.findall(r'histogram_quantile\([^,]+,[^;]*?\b([a-zA-Z_:][\w:]*)\{', expr):
        fam = family_of(name, families)
        if fam is None or fam[1] != "_bucket" or families[fam[0]][0] != "histogram":
            problems.append(f"histogram_quantile over {name}: not a histogram's buckets")
    return problems


def recording_rules() -> dict[str, set[str]]:
    """dflash:* recorded by the rule file, with the labels each record carries."""
    rules = monitoring.rule_file(HOST)
    return {r["record"]: set(r.get("labels", {})) for g in rules["groups"] for r in g["rules"] if "record" in r}


def test_the_query_checker_sees_a_wrong_name_label_rate_or_quantile():
    """The control for the two tests below: each kind of mistake is named."""
    fam, rec = recorded_families(), recording_rules()
    ok = 'sum by (dflash_instance) (rate(sglang:generation_tokens_total{job="x"}[5m]))'
    assert query_problems(ok, fam, rec) == []
    assert query_problems("rate(sglang:generation_tokens{job=\"x\"}[5m])", fam, rec) == \
        ["sglang:generation_tokens: no recording has it"]
    assert query_problems('sum by (worker) (smg_router_requests_total{endpoint="generate",gpu="0"})', fam, rec) == \
        ["smg_router_requests_total{gpu}: the series have no label gpu",
         "grouped by worker, which none of its series has"]
    assert query_problems("rate(sglang:num_queue_reqs[5m])", fam, rec) == \
        ["rate(sglang:num_queue_reqs): sglang:num_queue_reqs is a gauge"]
    assert query_problems("histogram_quantile(0.99, sum by (le) (rate(sglang:e2e_request_latency_seconds_sum{}[5m])))",
                          fam, rec) == ["grouped by le, which none of its series has",
                                        "histogram_quantile over sglang:e2e_request_latency_seconds_sum: not a "
                                        "histogram's buckets"]


def test_every_dashboard_query_reads_names_and_labels_the_exporters_write():
    families, records = recorded_families(), recording_rules()
    d = monitoring.dashboard()
    problems, names = {}, set()
    for panel in d["panels"]:
        for t in panel.get("targets", []):
            problems[f"{panel['title']} {t['refId']}"] = query_problems(t["expr"], families, records)
            names |= {n for n, _ in selectors(t["expr"])}
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            assert legend <= grouping_labels(t["expr"]), (panel["title"], legend)  # what the legend shows survives
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            sel, label = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"]).groups()
            problems[f"${v['name']}"] = query_problems(f"count by ({label}) ({sel})", families, records)
    assert {k: v for k, v in problems.items() if v} == {}
    # what the issue asks the dashboard to show, by the series it reads
    assert {"sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket",
            "sglang:inter_token_latency_seconds_bucket", "sglang:spec_accept_length", "sglang:num_running_reqs",
            "sglang:num_queue_reqs", "sglang:token_usage", "smg_router_requests_total", "smg_worker_retries_total",
            "smg_worker_health"} <= names


def test_the_dashboard_is_one_grafana_layout_with_every_variable_it_uses():
    d = monitoring.dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in d["templating"]["list"]}
    cells = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval", "__interval", "__range"}
            assert used <= variables, (p["title"], used - variables)


GPU_EXPORTERS = json.loads((METRICS / "gpu-exporters.json").read_text())


def expand(name: str) -> list[str]:
    """The names a `{__name__=~...}` regex of the rules' simple form (A|B, prefix_(a|b)) matches."""
    m = re.fullmatch(r"(.*?)\(([^()]*)\)(.*)", name)
    if m:
        return [x for alt in m.group(2).split("|") for x in expand(m.group(1) + alt + m.group(3))]
    return name.split("|")


def test_every_rule_reads_names_and_labels_the_exporters_write():
    families, records = recorded_families(), recording_rules()
    problems = {}
    for g in monitoring.rule_file(HOST)["groups"]:
        for r in g["rules"]:
            name = r.get("alert") or r["record"]
            problems[name] = query_problems(r["expr"], families, records)
            gpu = [x for n, _ in selectors(r["expr"]) if not family_of(n, families) and n not in records
                   and n not in ("up", "ALERTS") for x in expand(n)]
            if gpu:  # a GPU exporter's: its names and labels, of the exporter the rule's label names
                exporter = GPU_EXPORTERS[r["labels"]["exporter"]]
                problems[name] += [f"{n}: not among {r['labels']['exporter']}'s names" for n in gpu
                                   if n not in exporter["names"]]
                problems[name] += [f"grouped by {x}, which {r['labels']['exporter']} does not write"
                                   for x in grouping_labels(r["expr"]) - set(exporter["labels"]) - TARGET_LABELS]
    assert {k: v for k, v in problems.items() if v} == {}
    assert expand("a_(x|y)_z") == ["a_x_z", "a_y_z"] and expand("A|B") == ["A", "B"]


# ------------------------------------------------------------------ the thresholds and scrape configs

def test_acceptance_threshold_follows_the_block_size():
    t = lambda cfgs, **kw: {r["labels"]["dflash_instance"]: r["expr"] for r in  # noqa: E731
                            monitoring.thresholds_group(cfgs, **kw)["rules"]
                            if r["record"] == "dflash:threshold_accept_length_min"}
    cfgs = [instance("b16", draftModel="d", speculative={"algorithm": "DFLASH"}),
            instance("b8", draftModel="d", speculative={"algorithm": "DFLASH", "numDraftTokens": 8}),
            instance("eagle", draftModel="d", speculative={"algorithm": "EAGLE3"}),
            instance("plain"), instance("off", draftModel="d", speculative={"algorithm": "DFLASH"}, enableMetrics=False)]
    assert t(cfgs) == {"b16": "vector(4.000000)", "b8": "vector(2.000000)", "eagle": "vector(1.500000)"}
    assert t(cfgs, drafter_blocks={"b16": 32, "b8": 32}) == {"b16": "vector(8.000000)", "b8": "vector(2.000000)",
                                                              "eagle": "vector(1.500000)"}
    assert t(cfgs, min_accept={"eagle": 2.25})["eagle"] == "vector(2.250000)"


def test_drafter_block_size_is_read_where_sglang_reads_it(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"],
                                                     "dflash_config": {"block_size": 8}}))
    cfgs = [instance("a", draftModel=str(drafter), speculative={"algorithm": "DFLASH"}),
            instance("gone", draftModel=str(tmp_path / "missing"), speculative={"algorithm": "DFLASH"})]
    assert monitoring.drafter_block_sizes(cfgs) == {"a": 8}


def test_scrape_configs_reach_every_instance_with_metrics_and_the_router():
    cfgs = [instance("a", port=30000, host="0.0.0.0"), instance("b", port=30001, host="::"),
            instance("off", port=30002, enableMetrics=False)]
    rcfg = router.from_dict({"workers": ["http://127.0.0.1:30000"], "metricsPort": 30091})
    jobs = monitoring.scrape_configs(cfgs, rcfg, ["127.0.0.1:9400"], 5)
    assert [j["job_name"] for j in jobs] == ["dflash-instances", "dflash-router", "dflash-gpus"]
    assert jobs[0]["static_configs"] == [{"targets": ["127.0.0.1:30000"], "labels": {"dflash_instance": "a"}},
                                         {"targets": ["[::1]:30001"], "labels": {"dflash_instance": "b"}}]
    assert jobs[1]["static_configs"] == [{"targets": ["127.0.0.1:30091"]}] and jobs[0]["scrape_interval"] == "5s"
    assert monitoring.scrape_configs([instance("off", enableMetrics=False)]) == []


NIX_CASES = [  # (instances as the module has them, router settings or None, module arguments)
    ({"a": {"model": "m", "draftModel": "d", "speculative": {"algorithm": "DFLASH"}},
      "b": {"model": "m", "port": 30001, "host": "0.0.0.0", "draftModel": "d",
            "speculative": {"algorithm": "DDTREE", "numDraftTokens": 8}}},
     {"metricsHost": "127.0.0.1", "metricsPort": 30081}, {}),
    ({"e": {"model": "m", "draftModel": "d", "speculative": {"algorithm": "EAGLE3"}, "host": "::1"},
      "p": {"model": "m", "port": 30005}, "off": {"model": "m", "port": 30006, "enableMetrics": False}},
     None, {"minAcceptLength": {"e": 2}, "ttftP99Sec": 2.5, "alertFor": {"DflashQueueGrowing": "1m"},
            "intervalSec": 30, "gpuTargets": ["127.0.0.1:9835"]}),
]


def test_the_module_gives_what_dflashctl_monitoring_gives():
    """nix/lib/monitoring.nix (services.dflash.prometheus) and operations/monitoring.py: one result."""
    from nix_unit import full_options
    nix = nix_or_skip()
    for instances, rsettings, given in NIX_CASES:
        full = {n: full_options(n, o) for n, o in instances.items()}
        args = {k: given[k] for k in ("minAcceptLength", "ttftP99Sec", "alertFor") if k in given}
        scrape_args = {k: given[k] for k in ("intervalSec", "gpuTargets") if k in given}
        expr = (f"let m = import {MONITORING_LIB}; i = builtins.fromJSON {json.dumps(json.dumps(full))};"
                f" r = builtins.fromJSON {json.dumps(json.dumps(rsettings))};"
                f" a = builtins.fromJSON {json.dumps(json.dumps(args))};"
                f" s = builtins.fromJSON {json.dumps(json.dumps(scrape_args))}; in"
                " { scrape = m.scrapeConfigs ({ instances = i; router = r; } // s);"
                "   rules = m.ruleFile ({ instances = i; } // a); names = m.alertNames; }")
        done = subprocess.run([nix, "eval", "--json", "--impure", "--expr", expr], capture_output=True, text=True,
                              env=nix_env(), timeout=120)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        cfgs = [config.from_dict(o, n) for n, o in instances.items()]
        rcfg = router.from_dict({"workers": ["http://127.0.0.1:30000"], **rsettings}) if rsettings else None
        assert got["scrape"] == monitoring.scrape_configs(cfgs, rcfg, given.get("gpuTargets"), given.get("intervalSec"))
        expected = monitoring.rule_file(cfgs, min_accept={k: float(v) for k, v in given.get("minAcceptLength", {}).items()},
                                        ttft_p99_sec=given.get("ttftP99Sec"), alert_for=given.get("alertFor"))
        assert got["rules"] == json.loads(json.dumps(expected))
        assert got["names"] == monitoring.alert_names()


def test_dflashctl_monitoring_writes_the_three_files(tmp_path):
    promtool = prometheus_or_skip() / "promtool"
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"name": "a", "model": "m", "draftModel": "d", "speculative": {"algorithm": "DFLASH"}}))
    (tmp_path / "off.json").write_text(json.dumps({"name": "off", "model": "m", "port": 30009, "enableMetrics": False}))
    out = {k: tmp_path / f"out.{k}.json" for k in ("scrape", "rules", "dashboard")}
    done = subprocess.run([sys.executable, "-m", "dflashctl", "monitoring", "--instance", str(a), "--instance",
                           str(tmp_path / "off.json"), "--no-router", "--scrape-config", str(out["scrape"]),
                           "--rules", str(out["rules"]), "--dashboard", str(out["dashboard"]),
                           "--min-accept-length", "a=6", "--alert-for", "DflashAcceptanceLow=20m"],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "not scraped (enableMetrics is false): off" in done.stderr
    scrape = json.loads(out["scrape"].read_text())["scrape_configs"]
    assert [j["job_name"] for j in scrape] == ["dflash-instances"]
    rules = json.loads(out["rules"].read_text())
    assert rules["groups"][0]["rules"][0] == {"record": "dflash:threshold_accept_length_min",
                                              "expr": "vector(6.000000)", "labels": {"dflash_instance": "a"}}
    assert json.loads(out["dashboard"].read_text()) == monitoring.dashboard()
    check = subprocess.run([str(promtool), "check", "rules", str(out["rules"])], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    bad = subprocess.run([sys.executable, "-m", "dflashctl", "monitoring", "--instance", str(a), "--no-router",
                          "--rules", str(out["rules"]), "--alert-for", "NoSuchAlert=1m"],
                         capture_output=True, text=True, env=ENV, timeout=60)
    assert bad.returncode == 78 and "no alert named NoSuchAlert" in bad.stderr and "DflashAcceptanceLow" in bad.stderr


# ------------------------------------------------- what Prometheus refuses is refused before it is written

def monitoring_cli(capsys, *argv: str) -> tuple[int, str]:
    """`dflashctl monitoring ARGV` in this process: (exit code, stderr)."""
    rc = cli.main(["monitoring", *argv])
    return rc, capsys.readouterr().err


@pytest.fixture
def one_instance(tmp_path) -> Path:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"name": "a", "model": "m", "draftModel": "d", "speculative": {"algorithm": "DFLASH"}}))
    return a


ISSUE_42 = [  # (arguments, exit code, what the refusal names): the values issue 42 found written with exit 0
    (["--rules", "{out}", "--alert-for", "DflashAcceptanceLow=banana"], 2, "'banana' is not a duration"),
    (["--scrape-config", "{out}", "--gpu-exporter", ""], 2, "an empty target"),
    (["--scrape-config", "{out}", "--gpu-exporter", "nohostport"], 2, "has no port"),
    (["--scrape-config", "{out}", "--gpu-exporter", "h:99999"], 2, "the port '99999' is not 1-65535"),
    (["--scrape-config", "{out}", "--scrape-interval", "99999999999999"], 2, "out of range"),
    (["--rules", "{out}", "--ttft-p99", "0.0000001"], 2, "rounds to 0"),
]


@pytest.mark.parametrize("args,code,named", ISSUE_42, ids=[" ".join(a[2:]) or "empty" for a, _, _ in ISSUE_42])
def test_a_value_prometheus_refuses_is_refused_and_nothing_is_written(args, code, named, one_instance, tmp_path,
                                                                      capsys):
    out = tmp_path / "out.json"
    out.write_text("the file of the last good run\n")
    rc, err = monitoring_cli(capsys, "--instance", str(one_instance), "--no-router",
                             *[a.replace("{out}", str(out)) for a in args])
    assert rc == code and named in err, err
    assert err.splitlines()[-1].startswith("  fix: ") and "Traceback" not in err
    assert out.read_text() == "the file of the last good run\n"


def test_an_instance_address_prometheus_cannot_scrape_is_a_settings_error(tmp_path, capsys):
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"name": "h", "model": "m", "host": "a b", "port": 30001}))
    rc, err = monitoring_cli(capsys, "--instance", str(bad), "--no-router", "--scrape-config",
                             str(tmp_path / "s.json"), "--rules", str(tmp_path / "r.json"))
    assert rc == 78 and "(dflash_instance h): 'a b:30001'" in err and "`host`" in err.splitlines()[-1], err
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "r.json").exists()  # neither of the two


DURATIONS = ["30m", "1h30m", "0", "0s", "1y", "90s", "1d2h", "1ms", "01m", "5w", "1m0s", "292y", "banana", "",
             "1.5m", "-1m", "m", "1m1h", "1 m", "293y", "292y52w", "10000000000000y", "1M", "1h1h", " 1m", "1m ",
             "\u0663m"]


def promtool_ok(promtool: Path, *args: str) -> bool:
    return subprocess.run([str(promtool), "check", *args], capture_output=True, text=True, timeout=60).returncode == 0


def test_monitoring_and_promtool_agree_on_every_duration(one_instance, tmp_path, capsys):
    """Each duration through `dflashctl monitoring --alert-for`: a file it writes promtool takes; a
    file with a duration promtool refuses (made here, past the command) the command refused first."""
    promtool = prometheus_or_skip() / "promtool"
    cfgs = [config.load(one_instance)]
    disagree = []
    for i, d in enumerate(DURATIONS):
        out = tmp_path / f"rules-{i}.json"
        rc, err = monitoring_cli(capsys, "--instance", str(one_instance), "--no-router", "--rules", str(out),
                                 "--alert-for", f"DflashAcceptanceLow={d}")
        if rc == 0:
            taken = promtool_ok(promtool, "rules", str(out))
        else:
            assert rc == 2 and not out.exists(), err
            out.write_text(json.dumps(monitoring.rule_file(cfgs, alert_for={"DflashAcceptanceLow": d})))
            taken = promtool_ok(promtool, "rules", str(out))
        if taken != (rc == 0):
            disagree.append((d, rc, taken))
    assert disagree == []
    assert sum(promcheck.duration_problem(d) is None for d in DURATIONS) == 12  # both kinds are in the corpus


TARGETS = ["127.0.0.1:9400", "gpu-host:9835", "[::1]:9400", "gpu0.rack-2.example:9400", "", "nohostport", "h:99999",
           "h:0", "h:", ":9400", "::1:9400", "a b:9400", "h/x:9400", "http://h:9400", "h:+80", "[fe80::1%eth0]:9400"]


def test_a_target_monitoring_takes_promtool_takes_and_the_ones_it_refuses_prometheus_cannot_scrape(
        one_instance, tmp_path, capsys):
    """What promtool refuses (an empty target, a URL) the command refused first; what promtool takes but
    the command refuses, a real Prometheus keeps and never scrapes as written (it adds :80 to a target
    without a port; a wrong port, an IPv6 address without brackets, a space: its scrape fails)."""
    promtool = prometheus_or_skip() / "promtool"
    accepted, refused = [], []
    for i, t in enumerate(TARGETS):
        out = tmp_path / f"scrape-{i}.json"
        rc, err = monitoring_cli(capsys, "--instance", str(one_instance), "--no-router", "--scrape-config", str(out),
                                 "--gpu-exporter", t)
        if rc == 0:
            assert promtool_ok(promtool, "config", str(out)), t
            accepted.append(t)
        else:
            assert rc == 2 and not out.exists(), (t, err)
            jobs = monitoring.scrape_configs([config.load(one_instance)], None, [t])
            out.write_text(json.dumps({"scrape_configs": jobs}))
            refused.append((t, promtool_ok(promtool, "config", str(out))))
    assert accepted == TARGETS[:4]
    assert [t for t, taken in refused if not taken] == ["", "h/x:9400", "http://h:9400"]
    unscrapable = [t.replace(":9400", f":{free_port()}") if t.startswith(":") else t for t, taken in refused if taken]
    prom = Prometheus(tmp_path, [{"job_name": "refused", "scrape_interval": "1s",
                                  "static_configs": [{"targets": unscrapable}]}], {"groups": []}).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            seen = {t["discoveredLabels"]["__address__"]: t for t in prom.targets()}
            if len(seen) == len(unscrapable) and all(t["health"] != "unknown" for t in seen.values()):
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.5)
        scraped_as_written = [a for a, t in seen.items() if t["health"] == "up" or
                              (t["scrapeUrl"] == f"http://{a}/metrics" and not t["lastError"])]
        assert scraped_as_written == [] and seen["nohostport"]["scrapeUrl"] == "http://nohostport:80/metrics"
    finally:
        prom.stop()


def test_the_file_check_names_each_kind_of_mistake():
    """The control for the check every written file passes: each mistake Prometheus' parsers refuse."""
    good = monitoring.rule_file(HOST)
    assert promcheck.rule_file_problems(good, monitoring.alert_rules()) == []
    bad = json.loads(json.dumps(good))
    bad["groups"].append(json.loads(json.dumps(good["groups"][1])))  # a group name twice
    thresholds = bad["groups"][0]["rules"]
    thresholds[0] = {**thresholds[0], "for": "5m"}  # `for:` on a recording rule
    thresholds[1] = {**thresholds[1], "record": "dflash:bad-name", "labels": {"0bad": "x"}}
    bad["groups"][1]["rules"][0] = {**bad["groups"][1]["rules"][0], "expr": "up == banana", "for": "10 m",
                                    "severity": "critical"}
    thresholds[2] = {**thresholds[2], "expr": "vector(0.000000)"}
    found = promcheck.rule_file_problems(bad, monitoring.alert_rules())
    assert found == [
        "group dflash-thresholds, rule dflash:threshold_accept_length_min: a recording rule has no 'for' or "
        "'annotations'",
        "group dflash-thresholds, rule dflash:bad-name: 'dflash:bad-name' is not a name a recorded series can have",
        "group dflash-thresholds, rule dflash:bad-name: '0bad' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)",
        "group dflash-thresholds, rule dflash:threshold_accept_length_min: 'vector(0.000000)': the threshold "
        "rounds to 0 at six decimals",
        "group dflash-instances, rule DflashInstanceDown: unknown field 'severity'",
        "group dflash-instances, rule DflashInstanceDown: 'up == banana' is not an expression dflashctl generates",
        "group dflash-instances, rule DflashInstanceDown: for: '10 m' is not a duration Prometheus reads (whole "
        "numbers with the units y, w, d, h, m, s, ms, largest first, each once: 30s, 10m, 1h30m)",
        "group dflash-instances: the name is used twice"], found
    jobs = monitoring.scrape_configs(HOST, None, ["127.0.0.1:9400"])
    assert promcheck.scrape_problems(jobs) == []
    jobs[0]["static_configs"][0]["labels"] = {"dflash-instance": "a"}
    jobs[1]["scrape_interval"] = "0s"
    jobs.append(dict(jobs[1]))
    assert promcheck.scrape_problems(jobs) == [
        "job dflash-instances: 'dflash-instance' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)",
        "job dflash-gpus: scrape_interval: zero", "job dflash-gpus: a job needs a name of its own"]


def test_the_module_refuses_what_dflashctl_monitoring_refuses():
    """nix/lib/monitoring.nix's durationProblem gives promcheck's verdict on every duration, and the
    module asserts its `problems` (services.dflash.prometheus)."""
    nix = nix_or_skip()
    expr = (f"map (import {MONITORING_LIB}).durationProblem (builtins.fromJSON {json.dumps(json.dumps(DURATIONS))})")
    done = subprocess.run([nix, "eval", "--json", "--impure", "--expr", expr], capture_output=True, text=True,
                          env=nix_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p is None for p in json.loads(done.stdout)] == [promcheck.duration_problem(d) is None for d in DURATIONS]
    out = lite_host({"services": {"dflash": {"instances": LITE_INSTANCES, "prometheus": {
        "alertFor": {"DflashAcceptanceLow": "banana"}, "minAcceptLength": {"a": 0.5}, "ttftP99Sec": 0.0000001,
        "scrapeIntervalSec": 99999999999999}}, "prometheus": {"enable": True}}})
    [message] = [m for m in out["failedAssertions"] if m.startswith("services.dflash.prometheus: ")]
    for part in ('alertFor.DflashAcceptanceLow: "banana" is not a duration', "minAcceptLength.a: 0.500000 is below 1",
                 "ttftP99Sec: ", "scrapeIntervalSec: \"99999999999999s\" is out of range"):
        assert part in message, message


# ----------------------------------------------------------- a real Prometheus over the real router

class Prometheus:
    def __init__(self, tmp: Path, scrape_configs: list[dict], rules: dict):
        self.bin, self.tmp, self.port = prometheus_or_skip() / "prometheus", tmp, free_port()
        (tmp / "rules.json").write_text(json.dumps(rules))
        (tmp / "prometheus.json").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.json"], "scrape_configs": scrape_configs}))
        self.proc = None

    def start(self) -> "Prometheus":
        self.proc = subprocess.Popen([str(self.bin), "--config.file=prometheus.json", "--storage.tsdb.path=data",
                                      f"--web.listen-address=127.0.0.1:{self.port}"], cwd=self.tmp,
                                     stdout=open(self.tmp / "prometheus.log", "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while request(f"http://127.0.0.1:{self.port}/-/ready", timeout=2)[0] != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.tmp / "prometheus.log").read_text()
            time.sleep(0.2)
        return self

    def api(self, path: str, **params) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def query(self, q: str) -> list:
        return self.api("query", query=q)

    def targets(self) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/targets", timeout=10) as r:
            return json.loads(r.read())["data"]["activeTargets"]

    def wait(self, q: str, timeout: float = 60.0) -> list:
        deadline = time.monotonic() + timeout
        while not (found := self.query(q)):
            assert time.monotonic() < deadline, f"nothing for {q} after {timeout} s"
            time.sleep(0.5)
        return found

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


FAST_FOR = {"DflashAcceptanceLow": "6s", "DflashInstanceDown": "3s", "DflashRouterWorkerOutOfRotation": "3s"}


class Host:
    """Two speculative stand-ins with metrics (a, b) and a plain one without (p), behind the real
    router, scraped by a real Prometheus; four clients, half of them streaming."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.accept = tmp / "accept-a"
        self.accept.write_text("15.75")
        self.workers, self.files = {}, []
        for name, metrics in (("a", True), ("b", True), ("p", False)):
            port = free_port(55535)
            extra = ["--enable-metrics", "--speculative-algorithm", "DFLASH"] if metrics else []
            env = {"STANDIN_TOKEN_DELAY": "0.01"}
            if name == "a":
                env["STANDIN_ACCEPT_LENGTH_FILE"] = str(self.accept)
            self.workers[name] = Standin(port, tmp, **env)
            self.workers[name].args = extra
            settings = {"name": name, "model": "standin-model", "port": port, "enableMetrics": metrics}
            if metrics:
                settings |= {"draftModel": "standin-drafter", "speculative": {"algorithm": "DFLASH"}}
            f = tmp / f"{name}.json"
            f.write_text(json.dumps(settings))
            self.files.append(f)
        self.cfgs = [config.load(f) for f in self.files]
        self.router = Router({"workers": [w.url for w in self.workers.values()]}, tmp)
        self.router_file = tmp / "router.json"
        self.loads: list[Load] = []
        self.prometheus = None

    def start(self) -> "Host":
        for w in self.workers.values():
            start_with_args(w)
        self.router.start()
        self.router.wait_healthy([w.url for w in self.workers.values()])
        rcfg = router.from_dict(self.router.settings)
        self.prometheus = Prometheus(self.tmp, monitoring.scrape_configs(self.cfgs, rcfg, interval_sec=1),
                                     monitoring.rule_file(self.cfgs, alert_for=FAST_FOR))
        self.prometheus.start()  # kept before it is up: stop() ends it also when it never got ready
        for stream in (False, True):
            self.loads.append(Load(self.router.url + "/generate", generate_body(8, stream=stream), clients=2,
                                   max_requests=10 ** 6, seconds=600).start())
        return self

    def stop(self) -> None:
        for load in self.loads:
            load.stop()
        if self.prometheus:
            self.prometheus.stop()
        self.router.stop()
        for w in self.workers.values():
            w.stop()


def start_with_args(w: Standin) -> None:
    """Standin.start, with SGLang's flags the instance's settings would give (metrics, algorithm)."""
    log = open(w.log_dir / f"standin-{w.port}.log", "w")
    w.proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(w.port), "--host", "127.0.0.1",
                               "--model-path", "standin-model", *w.args], env=w.env, stdout=log,
                              stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while request(w.url + "/health", timeout=2)[0] != 200:
        assert w.proc.poll() is None and time.monotonic() < deadline, f"stand-in {w.port} did not come up"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The scenario, once: high acceptance, a's acceptance dropped, then b stopped under load."""
    if not HAVE_ROUTER:
        pytest.skip("sglang-router 0.3.2 is not installed (tests/run installs it)")
    h = Host(tmp_path_factory.mktemp("monitoring"))
    try:
        h.start()  # inside the try: a start that fails half way stops what it started
        p = h.prometheus
        p.wait('dflash:threshold_accept_length_min{dflash_instance="a"}', 30)
        p.wait('rate(sglang:generation_tokens_total{dflash_instance="a"}[10s]) > 0', 30)
        time.sleep(10)  # longer than the test's `for:` of the acceptance alert, with acceptance high
        h.dropped_at = time.time()
        h.accept.write_text("1.2")
        h.fired = p.wait('ALERTS{alertname="DflashAcceptanceLow",alertstate="firing"}', 60)
        h.fired_at = time.time()
        h.before_drop = p.api("query_range", query='ALERTS{alertname="DflashAcceptanceLow"}',
                              start=h.dropped_at - 30, end=h.dropped_at, step="1s")
        h.workers["b"].kill9()
        deadline = time.monotonic() + 30
        while h.router.workers().get(h.workers["b"].url) is not False:
            assert time.monotonic() < deadline, h.router.workers()
            time.sleep(0.2)
        h.out_alert = p.wait('ALERTS{alertname="DflashRouterWorkerOutOfRotation",alertstate="firing"}', 30)
        h.down_alert = p.wait('ALERTS{alertname="DflashInstanceDown",alertstate="firing"}', 30)
        p.wait("smg_worker_retries_total", 30)
        time.sleep(3)  # a few more scrapes of every series
        yield h
    finally:
        h.stop()


def test_acceptance_alert_fires_when_the_acceptance_drops_and_not_before(host):
    assert host.before_drop == []  # neither pending nor firing while the acceptance was 15.75
    assert [a["metric"]["dflash_instance"] for a in host.fired] == ["a"]
    assert host.fired_at - host.dropped_at >= 6  # its `for:` held first
    assert float(host.prometheus.query('sglang:spec_accept_length{dflash_instance="a"}')[0]["value"][1]) == 1.2


def test_a_stopped_worker_is_named_by_the_router_alert_and_the_instance_alert(host):
    b = host.workers["b"].url
    assert [a["metric"]["worker"] for a in host.out_alert] == [b]
    assert [a["metric"]["dflash_instance"] for a in host.down_alert] == ["b"]


def dashboard_queries() -> list[str]:
    d = monitoring.dashboard()
    out = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":  # label_values(SELECTOR, LABEL): the selector's series with that label
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            out.append(f"count by ({m.group(2)}) ({m.group(1)})")
    return out


def test_every_dashboard_query_returns_series_from_the_scraped_data(host):
    queries = dashboard_queries()
    assert len(queries) >= 12
    empty = []
    for q in queries:
        concrete = q.replace("$instance", ".*").replace("$__rate_interval", "15s")
        if not host.prometheus.query(concrete):
            empty.append(concrete)
    assert empty == []
    per_instance = host.prometheus.query(dashboard_queries()[-1].replace("$instance", ".*"))
    # b is stopped: its first failed scrape marked its series stale, so the variable offers a alone
    assert [s["metric"]["dflash_instance"] for s in per_instance] == ["a"]


def test_the_live_router_writes_the_recorded_families_with_their_labels(host):
    """What the name checks above rest on: every family of the recordings (the H200's, and
    loopback's after a kill) that the real router writes here has no label they lack. (It writes
    a few more, e.g. smg_http_inflight_request_age_count while requests are in flight; no query
    reads them.)"""
    families, live = recorded_families(), {}
    for series in host.prometheus.query('{job="dflash-router"}'):
        fam = family_of(series["metric"]["__name__"], families)
        if fam is None:
            continue
        live.setdefault(fam[0], set()).update(set(series["metric"]) - {"__name__", "job", "instance", "le", "quantile"})
    assert "smg_worker_retries_total" in live and "smg_worker_health" in live
    assert {f: sorted(labels - families[f][1]) for f, labels in live.items() if labels - families[f][1]} == {}


def test_status_over_the_host_shows_every_row_and_names_the_stopped_worker(host):
    from dflashctl.smoke import schema
    argv = [sys.executable, "-m", "dflashctl", "status", "--router", str(host.tmp / "router.json"),
            "--state-dir", str(host.tmp / "no-rollout"), *[x for f in host.files for x in ("--instance", str(f))]]
    done = subprocess.run(argv + ["--json"], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 1, done.stderr  # b is down and out of rotation
    rep = json.loads(done.stdout)
    assert schema.problems(rep, json.loads((REPO / "docs" / "status.schema.json").read_text())) == []
    rows = {r["name"]: r for r in rep["instances"]}
    assert list(rows) == ["a", "b", "p"]
    assert rows["a"]["answers"] and rows["a"]["metrics"] == "on" and rows["a"]["accept_length"] == 1.2
    assert rows["a"]["tokens_per_s"] > 0 and rows["a"]["accept_length_min"] == 4.0
    assert any("acceptance length 1.20 below 4" in p for p in rows["a"]["problems"])
    assert rows["b"]["answers"] is False and rows["b"]["problems"] == [f"does not answer at {host.workers['b'].url}"]
    assert rows["p"]["healthy"] and rows["p"]["metrics"] == "off" and rows["p"]["algorithm"] is None
    assert any("enableMetrics is false" in m for m in rows["p"]["missing"]) and rows["p"]["requests_running"] is not None
    assert rep["systemd"] is False and rep["systemd_missing"]
    rt = rep["router"]
    assert [w["instance"] for w in rt["workers_out_of_rotation"]] == ["b"]
    assert sorted(w["instance"] for w in rt["workers_in_rotation"]) == ["a", "p"]
    assert rt["requests_per_s"] > 0 and rt["retries_total"] > 0
    text = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[1:4]] == ["a", "b", "p"]
    assert any(ln.startswith("router ") and f"out: b ({host.workers['b'].url})" in ln for ln in lines), text.stdout


# ----------------------------------------------------------------- the module on a host (nixos-lite)

def lite_host(host: dict) -> dict:
    nix_or_skip()
    done = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json",
                           str(REPO / "tests" / "nix" / "harness" / "monitoring-host.nix"),
                           "--argstr", "hostJSON", json.dumps(host)], capture_output=True, text=True,
                          env=nix_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


LITE_INSTANCES = {"a": {"model": "m", "draftModel": "d", "speculative": {"algorithm": "DFLASH"}, "gpus": [0]},
                  "p": {"model": "m", "port": 30001, "gpus": [1], "enableMetrics": False}}


def test_a_host_with_prometheus_and_grafana_gets_the_scrape_configs_rules_and_dashboard():
    out = lite_host({"services": {
        "dflash": {"instances": LITE_INSTANCES, "router": {"enable": True},
                   "prometheus": {"alertFor": {"DflashAcceptanceLow": "30m"}, "minAcceptLength": {"a": 5}}},
        "prometheus": {"enable": True, "exporters": {"dcgm": {"enable": True, "port": 9400}}},
        "grafana": {"enable": True}}})
    assert out["failedAssertions"] == []
    cfgs = [config.from_dict(o, n) for n, o in LITE_INSTANCES.items()]
    defaults = router.defaults()
    rcfg = router.from_dict({"workers": ["http://127.0.0.1:30000"], "metricsHost": defaults["metricsHost"],
                             "metricsPort": defaults["metricsPort"]})
    assert out["prometheus"]["scrapeConfigs"] == monitoring.scrape_configs(cfgs, rcfg, ["127.0.0.1:9400"])
    [rules] = out["prometheus"]["ruleFiles"]
    assert rules["name"] == "dflash.rules.json"
    assert rules["rules"] == json.loads(json.dumps(monitoring.rule_file(
        cfgs, min_accept={"a": 5.0}, alert_for={"DflashAcceptanceLow": "30m"})))
    assert out["grafana"]["provision"] is True
    [provider] = out["grafana"]["providers"]
    assert provider["name"] == "dflash" and "grafana-dashboard.json $out/dflash-host.json" in provider["script"]


def test_a_host_without_prometheus_gets_none_and_a_wrong_name_is_refused():
    quiet = lite_host({"services": {"dflash": {"instances": LITE_INSTANCES}}})
    assert quiet["prometheus"] == {"scrapeConfigs": [], "ruleFiles": []} and quiet["grafana"]["providers"] == []
    wrong = lite_host({"services": {"dflash": {"instances": LITE_INSTANCES,
                                               "prometheus": {"alertFor": {"NoSuch": "1m"}, "minAcceptLength": {"x": 2}}},
                                    "prometheus": {"enable": True}}})
    assert any("alertFor names an alert that dflash.rules.json does not have" in m for m in wrong["failedAssertions"])
    assert any("minAcceptLength names an instance that is not enabled here" in m for m in wrong["failedAssertions"])
