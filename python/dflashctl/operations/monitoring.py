"""`dflashctl monitoring`: a host's Prometheus scrape configuration, alert rules and Grafana dashboard.

The files in data/monitoring/ are the one source: `dflash.rules.json` (a Prometheus rule file; JSON
is YAML), `grafana-dashboard.json`, and `monitoring.json` (job names, the instance label, the
threshold rules). What differs per host is computed here and, for the NixOS module, by its twin
nix/lib/monitoring.nix (tests hold both to one result):

- the scrape configuration: every instance with enableMetrics at the address a client on this host
  reaches it (its own port: SGLang 0.5.11 serves /metrics there, without the API key), labelled
  `dflash_instance`; the router's metrics port; GPU exporters given by the host;
- the thresholds as recorded series, one per instance (`dflash:threshold_accept_length_min` for a
  speculative one: a quarter of its block, at least 1.5, or minAcceptLength; and
  `dflash:threshold_ttft_p99_seconds`), which the alert rules compare with, so the rule file is the
  same everywhere;
- `for:` of any alert, given by name (a test's copy runs them in seconds).

Every value is held to what Prometheus takes (promcheck.py: durations, targets, label names, the
expressions) as it is read, and the finished files again before any is written: a bad value is
refused (exit 2 for an argument, 78 for a setting) and nothing is written, because Prometheus
refuses a rule file whole, and with it every alert of the host.
"""

import json
import os
import sys
from functools import cache
from pathlib import Path

from dflashctl import cli_help, output
from dflashctl.errors import CONFIG, USAGE, DflashError
from dflashctl.operations import instances, promcheck, router, unit_data
from dflashctl.service import config
from dflashctl.service.config import InstanceConfig

DATA = unit_data.DATA / "monitoring"
RULES_FILE = DATA / "dflash.rules.json"
DASHBOARD_FILE = DATA / "grafana-dashboard.json"


@cache
def _json(name: str) -> str:
    return (DATA / name).read_text()


def data() -> dict:
    return json.loads(_json("monitoring.json"))


def alert_rules() -> dict:
    return json.loads(_json("dflash.rules.json"))


def dashboard() -> dict:
    return json.loads(_json("grafana-dashboard.json"))


def alert_names() -> list[str]:
    return [r["alert"] for g in alert_rules()["groups"] for r in g["rules"] if "alert" in r]


# ------------------------------------------------------------------------------------- thresholds

def block_size(cfg: InstanceConfig, drafter_block: int | None = None) -> int | None:
    """The tokens a speculative instance drafts per step; None when it does not speculate."""
    algorithm = cfg.speculative.algorithm
    if algorithm is None:
        return None
    if cfg.speculative.num_draft_tokens is not None:
        return cfg.speculative.num_draft_tokens
    if drafter_block is not None and algorithm in ("DFLASH", "DDTREE"):
        return drafter_block
    return data()["thresholds"]["acceptLengthMin"]["blockSizeIfUnset"][algorithm]


def min_accept_length(block: int) -> float:
    rule = data()["thresholds"]["acceptLengthMin"]
    return max(float(rule["floor"]), block * float(rule["blockFraction"]))


def _number(x: float) -> str:
    return f"{float(x):f}"  # as Nix's toString writes a float: the Nix twin gives the same text


def scraped(cfgs: list[InstanceConfig]) -> list[InstanceConfig]:
    return sorted((c for c in cfgs if c.enable_metrics), key=lambda c: c.name)


def thresholds_group(cfgs: list[InstanceConfig], drafter_blocks: dict[str, int] | None = None,
                     min_accept: dict[str, float] | None = None, ttft_p99_sec: float | None = None) -> dict:
    d, label = data(), data()["instanceLabel"]
    drafter_blocks, min_accept = drafter_blocks or {}, min_accept or {}
    ttft = d["thresholds"]["ttftP99Sec"]["default"] if ttft_p99_sec is None else ttft_p99_sec
    rules = []
    for c in scraped(cfgs):
        block = block_size(c, drafter_blocks.get(c.name))
        if block is not None:
            value = min_accept.get(c.name, min_accept_length(block))
            rules.append({"record": d["thresholds"]["acceptLengthMin"]["record"],
                          "expr": f"vector({_number(value)})", "labels": {label: c.name}})
        rules.append({"record": d["thresholds"]["ttftP99Sec"]["record"], "expr": f"vector({_number(ttft)})",
                      "labels": {label: c.name}})
    return {"name": d["thresholdsGroup"], "rules": rules}


def rule_file(cfgs: list[InstanceConfig], drafter_blocks: dict[str, int] | None = None,
              min_accept: dict[str, float] | None = None, ttft_p99_sec: float | None = None,
              alert_for: dict[str, str] | None = None) -> dict:
    """This host's rules: its thresholds, then dflash.rules.json with `alert_for` durations."""
    alert_for = alert_for or {}
    unknown = sorted(set(alert_for) - set(alert_names()))
    if unknown:
        raise DflashError(f"no alert named {', '.join(unknown)}", f"the alerts are {', '.join(alert_names())}",
                          "name one of them", CONFIG)
    groups = []
    for g in alert_rules()["groups"]:
        rules = [{**r, "for": alert_for[r["alert"]]} if r.get("alert") in alert_for else r for r in g["rules"]]
        groups.append({**g, "rules": rules})
    return {"groups": [thresholds_group(cfgs, drafter_blocks, min_accept, ttft_p99_sec)] + groups}


# ---------------------------------------------------------------------------------------- scraping

def target(host: str, port: int) -> str:
    """host:port as a client on this host reaches it (a wildcard address through loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def scrape_configs(cfgs: list[InstanceConfig], router_cfg=None, gpu_targets: list[str] | None = None,
                   interval_sec: int | None = None) -> list[dict]:
    d = data()
    interval = f"{interval_sec or d['scrapeIntervalSec']}s"
    jobs = []
    instances = [{"targets": [target(c.host, c.port)], "labels": {d["instanceLabel"]: c.name}}
                 for c in scraped(cfgs)]
    if instances:
        jobs.append({"job_name": d["jobs"]["instances"], "scrape_interval": interval, "metrics_path": "/metrics",
                     "static_configs": instances})
    if router_cfg is not None:
        jobs.append({"job_name": d["jobs"]["router"], "scrape_interval": interval, "metrics_path": "/metrics",
                     "static_configs": [{"targets": [target(router_cfg.metrics_host, router_cfg.metrics_port)]}]})
    if gpu_targets:
        jobs.append({"job_name": d["jobs"]["gpus"], "scrape_interval": interval, "metrics_path": "/metrics",
                     "static_configs": [{"targets": list(gpu_targets)}]})
    return jobs


# ------------------------------------------------------------------------------------ the command

def router_settings(path: str | None, no_router: bool):
    """The router's settings (no keys read), or None: --no-router, or no file at the default path."""
    if no_router and path is not None:
        raise DflashError("--router and --no-router do not go together", f"--router {path} names a router, "
                          "--no-router leaves it out", "pass one of them", USAGE)
    default = unit_data.router_unit_data()["settingsPath"]
    if no_router or (path is None and not Path(default).exists()):
        return None
    return router.from_dict(config.read_json(path or default), origin=path or default)


def drafter_block_sizes(cfgs: list[InstanceConfig]) -> dict[str, int]:
    """Each DFLASH/DDTREE drafter's dflash_config.block_size, where its config.json is readable here
    (a local directory, or the instance's hub cache at its revision), as SGLang 0.5.11 reads it."""
    from dflashctl.service import model_check  # reads model files: only this command needs it
    out = {}
    for c in cfgs:
        if c.speculative.algorithm not in ("DFLASH", "DDTREE") or c.draft_model is None:
            continue
        block = model_check.drafter_block_size(c)
        if block is not None:
            out[c.name] = block
    return out


def name_values(values: list[str], flag: str, convert, example: str) -> dict:
    """NAME=VALUE arguments; a malformed one is a usage error."""
    out = {}
    for v in values:
        name, sep, value = v.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = convert(value)
        except ValueError:
            raise DflashError(f"{flag} {v!r} is not NAME=VALUE", f"e.g. {flag} {example}",
                              f"see dflashctl {'status' if 'accept' in flag else 'monitoring'} --help", USAGE) from None
    return out


def alert_durations(values: list[str]) -> dict[str, str]:
    """--alert-for NAME=DURATION, each duration one Prometheus reads."""
    given = name_values(values, "--alert-for", str, "DflashAcceptanceLow=30m")
    for name, value in given.items():
        if problem := promcheck.duration_problem(value):
            raise DflashError(f"--alert-for {name}={value} is refused", f"{problem}; Prometheus refuses a rule "
                              "file with a bad `for:`, and with it every alert of the host",
                              f"e.g. --alert-for {name}=30m", USAGE)
    return given


def gpu_targets(values: list[str]) -> list[str]:
    """--gpu-exporter HOST:PORT, each a target Prometheus can scrape as written."""
    for v in values:
        if problem := promcheck.target_problem(v):
            raise DflashError(f"--gpu-exporter {v!r} is refused", f"{problem}; Prometheus would keep the target "
                              "and never scrape it, so the GPU alerts would never see data",
                              "e.g. --gpu-exporter 127.0.0.1:9400 (dcgm-exporter) or 127.0.0.1:9835 "
                              "(nvidia_gpu_exporter)", USAGE)
    return list(values)


def check_numbers(interval_sec: int | None, ttft_p99_sec: float | None) -> None:
    """--scrape-interval as a duration Prometheus reads, --ttft-p99 as a threshold it can hold."""
    if interval_sec is not None and (problem := promcheck.duration_problem(f"{interval_sec}s")):
        raise DflashError(f"--scrape-interval {interval_sec} is refused", f"{problem}; Prometheus would refuse "
                          "the scrape configuration",
                          f"pass seconds, e.g. --scrape-interval {data()['scrapeIntervalSec']}", USAGE)
    if ttft_p99_sec is not None and promcheck.threshold_problem(f"vector({_number(ttft_p99_sec)})"):
        raise DflashError(f"--ttft-p99 {ttft_p99_sec:g} is refused", "it rounds to 0 at the six decimals the "
                          "rule file holds, and the alert would fire on every request",
                          "pass seconds, e.g. --ttft-p99 10", USAGE)


def checked(rules: dict | None, scrape: dict | None) -> None:
    """The finished files, held once more to what Prometheus takes before any is written."""
    for flag, found in (("--rules", promcheck.rule_file_problems(rules, alert_rules()) if rules else []),
                        ("--scrape-config", promcheck.scrape_problems(scrape["scrape_configs"]) if scrape else [])):
        if found:
            raise DflashError(f"the {flag} file would be one Prometheus refuses or cannot scrape; nothing was "
                              "written", f"{len(found)} problem(s)\n  - " + "\n  - ".join(found),
                              "fix the instance's or the router's settings named above (an instance's `host`, "
                              "the router's `metricsHost`), or the data file they come from", CONFIG)


def accept_length(text: str) -> float:
    value = float(text)
    if not value >= 1 or value == float("inf"):  # SGLang's acceptance length counts the bonus token
        raise ValueError
    return value


def unknown_instances(given: dict, cfgs: list[InstanceConfig], flag: str) -> None:
    unknown = sorted(set(given) - {c.name for c in cfgs})
    if unknown:
        raise DflashError(f"{flag} names no instance: {', '.join(unknown)}",
                          f"the instances are {', '.join(sorted(c.name for c in cfgs))}", "use one of them", CONFIG)


def register(subparsers) -> None:
    p = subparsers.add_parser("monitoring", help="this host's Prometheus scrape config, alert rules and dashboard",
                              **cli_help.texts("monitoring", __doc__))
    p.add_argument("--instance", action="append", default=[], metavar="FILE",
                   help=f"an instance's settings, or the module's dflash-instances.json (repeat; default: "
                        f"{instances.DEFAULT_TEXT})")
    p.add_argument("--router", metavar="FILE", help="the router settings (default: "
                   f"{unit_data.router_unit_data()['settingsPath']} if it exists)")
    p.add_argument("--no-router", action="store_true", help="leave the router out")
    p.add_argument("--scrape-config", metavar="FILE", help="write the scrape_configs fragment of prometheus.yml")
    p.add_argument("--rules", metavar="FILE", help="write the alert rules (a rule file for rule_files)")
    p.add_argument("--dashboard", metavar="FILE", help="write the Grafana dashboard JSON")
    p.add_argument("--min-accept-length", action="append", default=[], metavar="NAME=X",
                   help="the acceptance length below which NAME's alert fires (default: a quarter of its block, "
                        "at least 1.5)")
    p.add_argument("--ttft-p99", type=cli_help.positive_float, metavar="SEC",
                   help="time to first token p99 threshold (default "
                   f"{data()['thresholds']['ttftP99Sec']['default']} s)")
    p.add_argument("--gpu-exporter", action="append", default=[], metavar="HOST:PORT",
                   help="a dcgm-exporter (9400) or nvidia_gpu_exporter (9835) to scrape too (repeat)")
    p.add_argument("--scrape-interval", type=cli_help.positive_int, metavar="SEC",
                   help=f"seconds between scrapes (default {data()['scrapeIntervalSec']})")
    p.add_argument("--alert-for", action="append", default=[], metavar="ALERT=DURATION",
                   help="another `for:` for an alert, e.g. DflashAcceptanceLow=30m")
    p.add_argument("--host", action="append", default=[], metavar="NAME=ADDRESS",
                   help="a fleet: each host's name and address (repeat), its own files in --from DIR/NAME/ "
                        "(fleet_monitoring.py)")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="with --host: DIR/NAME/scrape.json and rules.json")
    p.set_defaults(func=run)


def run(args) -> int:
    outputs = [(output.check(path, flag), flag) for path, flag in ((args.scrape_config, "--scrape-config"),
               (args.rules, "--rules"), (args.dashboard, "--dashboard")) if path is not None]
    if not outputs:
        raise DflashError("nothing to write", "none of --scrape-config, --rules, --dashboard was given",
                          "pass --scrape-config FILE, --rules FILE and/or --dashboard FILE", USAGE)
    paths = [os.path.realpath(p) if p is not None else output.STDOUT for p, _ in outputs]
    if len(set(paths)) < len(paths):
        raise DflashError("two outputs name one file", ", ".join(f for _, f in outputs),
                          "give each output its own file", USAGE)
    if args.host or args.from_dir:  # a fleet: the hosts' own files, not this host's settings
        from dflashctl.operations import fleet_monitoring
        want = {"--scrape-config": args.scrape_config is not None, "--rules": args.rules is not None,
                "--dashboard": args.dashboard is not None}
        fleet = fleet_monitoring.texts(args.host, args.from_dir, want, data()["thresholdsGroup"], dashboard())
        return _write(args, {f: (t, fleet_monitoring.HINTS[f]) for f, t in fleet.items()})
    min_accept = name_values(args.min_accept_length, "--min-accept-length", accept_length, "qwen3=3.5")
    alert_for = alert_durations(args.alert_for)
    gpus = gpu_targets(args.gpu_exporter)
    check_numbers(args.scrape_interval, args.ttft_p99)
    cfgs = instances.load(args.instance)
    rcfg = router_settings(args.router, args.no_router)
    unknown_instances(min_accept, cfgs, "--min-accept-length")
    texts, scrape, rules = {}, None, None
    if args.scrape_config:
        scrape = {"scrape_configs": scrape_configs(cfgs, rcfg, gpus, args.scrape_interval)}
        texts["--scrape-config"] = (json.dumps(scrape, indent=2) + "\n",
                                    "merge its scrape_configs into prometheus.yml")
    if args.rules:
        rules = rule_file(cfgs, drafter_block_sizes(cfgs), min_accept, args.ttft_p99, alert_for)
        texts["--rules"] = (json.dumps(rules, indent=2) + "\n",
                            "list it under rule_files in prometheus.yml (`promtool check rules` reads it)")
    if args.dashboard:
        texts["--dashboard"] = (json.dumps(dashboard(), indent=2) + "\n",
                                "import it in Grafana (Dashboards > New > Import), or provision it")
    checked(rules, scrape)
    off = sorted(c.name for c in cfgs if not c.enable_metrics)
    if off:
        print(f"dflashctl monitoring: not scraped (enableMetrics is false): {', '.join(off)}", file=sys.stderr)
    return _write(args, texts)


def _write(args, texts: dict) -> int:
    by_flag = {"--scrape-config": args.scrape_config, "--rules": args.rules, "--dashboard": args.dashboard}
    to_files = [(by_flag[f], texts[f][0], f) for f in texts if by_flag[f] != output.STDOUT]
    output.write_all(to_files)
    for f in texts:
        if by_flag[f] == output.STDOUT:
            output.emit(texts[f][0])
        else:
            print(f"{by_flag[f]}: {texts[f][1]}", file=sys.stderr)
    return 0
