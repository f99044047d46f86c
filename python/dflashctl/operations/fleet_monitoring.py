"""`dflashctl monitoring --host NAME=ADDRESS ... --from DIR`: one Prometheus and one dashboard for a fleet.

Each host writes its own files with `dflashctl monitoring --scrape-config scrape.json --rules
rules.json` (what it knows: its instances, ports, thresholds); the fleet's engine gathers them as
DIR/<NAME>/scrape.json and DIR/<NAME>/rules.json (Ansible's fetch lays them out so). This turns them
into the fleet's files, deriving everything from the host's files so there is one source:

- scrape configuration: one job per kind (instances, router, GPUs) holding every host's targets,
  each labelled `host: NAME`; a target a host reaches on loopback is reached at ADDRESS instead (the
  fleet's Prometheus is elsewhere: the instance or router must listen on an address it reaches);
- rules: each host's thresholds (recorded series) labelled with its host; every alert's groupings
  and matchings (`by (...)`, `on (...)`, an aggregation without one) also by `host`, so two hosts'
  instances of one name stay apart, and each summary starts with the host. The hosts' alert rules
  must be the same (they come from one file; a different `--alert-for` on one host is refused);
- dashboard: a `host` variable (several, or all) before the instance variable, every query limited
  to it and grouped by it, each legend starting with the host.
"""

import json
import re
from pathlib import Path

from dflashctl import inputs
from dflashctl.errors import CONFIG, INPUT, USAGE, DflashError

HOST_LABEL = "host"
HINTS = {"--scrape-config": "merge its scrape_configs into the fleet Prometheus's prometheus.yml",
         "--rules": "list it under rule_files in the fleet Prometheus's prometheus.yml",
         "--dashboard": "import it in Grafana: its host variable picks the hosts"}
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
AGGREGATIONS = ("sum", "min", "max", "avg", "count", "group", "stddev", "stdvar")
_GROUPING = re.compile(r"\b(by|on)\s*\(([^)]*)\)")
_ADDRESS = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]")  # a name or IP, no port: the host's ports are its own
_BARE_AGGREGATION = re.compile(r"\b(" + "|".join(AGGREGATIONS) + r")\s*\(")


def parse_hosts(values: list[str]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, sep, address = v.partition("=")
        if not sep or not re.fullmatch(r"[\w.-]+", name) or not _ADDRESS.fullmatch(address):
            raise DflashError(f"--host {v!r} is not NAME=ADDRESS", "the host's name (its directory under --from) "
                              "and the address the fleet's Prometheus reaches it at",
                              "e.g. --host gpu-a=10.0.0.11", USAGE)
        out.append((name, address))
    names = [n for n, _ in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DflashError(f"--host names {', '.join(twice)} twice", "", "give each host once", USAGE)
    return out


def _read(directory: Path, name: str, file: str, key: str) -> dict:
    path = directory / name / file
    fix = f"on {name}: `dflashctl monitoring --scrape-config scrape.json --rules rules.json`, then copy both to {path.parent}"
    data = inputs.read_json(path, "monitoring file", fix, INPUT)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise DflashError(f"{path} is not a file `dflashctl monitoring` wrote", f"it has no {key} list", fix, INPUT)
    return data


# ---------------------------------------------------------------------------------------------- scraping

def _target(target: str, address: str) -> str:
    host, sep, port = target.rpartition(":")
    return f"{address}:{port}" if sep and host in LOOPBACK else target


def scrape_configs(hosts: list[tuple[str, str]], frags: dict[str, dict]) -> list[dict]:
    jobs: dict[str, dict] = {}
    for name, address in hosts:
        for job in frags[name]["scrape_configs"]:
            merged = jobs.setdefault(job["job_name"], {**job, "static_configs": []})
            if {k: v for k, v in merged.items() if k != "static_configs"} != \
                    {k: v for k, v in job.items() if k != "static_configs"}:
                raise DflashError(f"the hosts scrape {job['job_name']} differently", f"{name}'s job differs in its "
                                  "interval or path", "write every host's files with the same `dflashctl "
                                  "monitoring` options (--scrape-interval)", CONFIG)
            for sc in job.get("static_configs", []):
                merged["static_configs"].append({"targets": [_target(t, address) for t in sc.get("targets", [])],
                                                 "labels": {**sc.get("labels", {}), HOST_LABEL: name}})
    return list(jobs.values())


# ------------------------------------------------------------------------------------------------- rules

def by_host(expr: str) -> str:
    """The expression with `host` in every grouping and matching (an aggregation without one gets one)."""
    def grouping(m: re.Match) -> str:
        labels = [x.strip() for x in m.group(2).split(",") if x.strip()]
        return f"{m.group(1)} ({', '.join([HOST_LABEL] + [x for x in labels if x != HOST_LABEL])})"
    expr = _GROUPING.sub(grouping, expr)
    return _BARE_AGGREGATION.sub(lambda m: f"{m.group(1)} by ({HOST_LABEL}) (", expr)


def _fleet_rule(rule: dict) -> dict:
    out = {**rule, "expr": by_host(rule["expr"])}
    if "alert" in rule and "summary" in rule.get("annotations", {}):
        out["annotations"] = {**rule["annotations"],
                              "summary": "{{ $labels.%s }}: %s" % (HOST_LABEL, rule["annotations"]["summary"])}
    return out


def rule_file(hosts: list[tuple[str, str]], rules: dict[str, dict], thresholds_name: str) -> dict:
    thresholds, alerts = [], None
    for name, _ in hosts:
        groups = rules[name]["groups"]
        for g in groups:
            if g.get("name") == thresholds_name:
                thresholds += [{**r, "labels": {**r.get("labels", {}), HOST_LABEL: name}} for r in g["rules"]]
        others = [g for g in groups if g.get("name") != thresholds_name]
        if alerts is not None and others != alerts[1]:
            raise DflashError(f"{name}'s alert rules differ from {alerts[0]}'s", "the fleet's Prometheus evaluates "
                              "one set of rules over every host", "write every host's rules with the same "
                              "--alert-for (and the same dflashctl)", CONFIG)
        alerts = alerts or (name, others)
    groups = [{"name": g["name"], **{k: v for k, v in g.items() if k not in ("name", "rules")},
               "rules": [_fleet_rule(r) for r in g["rules"]]} for g in (alerts[1] if alerts else [])]
    return {"groups": [{"name": thresholds_name, "rules": thresholds}] + groups}


# --------------------------------------------------------------------------------------------- dashboard

def _limited(expr: str) -> str:
    return by_host(expr.replace("{", '{%s=~"$%s",' % (HOST_LABEL, HOST_LABEL)))


def dashboard(host_board: dict) -> dict:
    """The fleet's dashboard from the host's (monitoring.dashboard(), passed in: that module calls this one)."""
    d = json.loads(json.dumps(host_board))
    variables = d["templating"]["list"]
    instance = next(v for v in variables if v["name"] == "instance")
    host_var = {**instance, "name": HOST_LABEL, "label": "Host",
                "definition": f'label_values(up{{job=~"dflash-.*"}}, {HOST_LABEL})',
                "query": {"query": f'label_values(up{{job=~"dflash-.*"}}, {HOST_LABEL})', "refId": "hosts"}}
    instance = {**instance, "definition": _limited(instance["definition"]),
                "query": {**instance["query"], "query": _limited(instance["query"]["query"])}}
    at = variables.index(next(v for v in variables if v["name"] == "instance"))
    d["templating"]["list"] = variables[:at] + [host_var, instance] + variables[at + 1:]
    for panel in d.get("panels", []):
        for t in panel.get("targets", []):
            t["expr"] = _limited(t["expr"])
            if "legendFormat" in t:
                t["legendFormat"] = "{{%s}} %s" % (HOST_LABEL, t["legendFormat"])
    d["title"] = d.get("title", "DFlash") + " fleet"
    if "uid" in d:
        d["uid"] = f"{d['uid']}-fleet"
    return d


def texts(host_args: list[str], directory: str | None, want: dict[str, bool], thresholds_group: str,
          host_board: dict) -> dict[str, str]:
    """The fleet's files; `thresholds_group` and `host_board` are monitoring.py's (it calls this)."""
    if not directory:
        raise DflashError("--host without --from", "the hosts' own monitoring files are read from DIR/<NAME>/",
                          "pass --from DIR", USAGE)
    if not host_args:
        raise DflashError("--from without --host", "the fleet's files are made for the hosts named",
                          "name each host with --host NAME=ADDRESS (its files in DIR/NAME/)", USAGE)
    hosts = parse_hosts(host_args)
    root = Path(directory)
    out = {}
    if want["--scrape-config"]:
        frags = {n: _read(root, n, "scrape.json", "scrape_configs") for n, _ in hosts}
        out["--scrape-config"] = json.dumps({"scrape_configs": scrape_configs(hosts, frags)}, indent=2) + "\n"
    if want["--rules"]:
        rules = {n: _read(root, n, "rules.json", "groups") for n, _ in hosts}
        out["--rules"] = json.dumps(rule_file(hosts, rules, thresholds_group), indent=2) + "\n"
    if want["--dashboard"]:
        out["--dashboard"] = json.dumps(dashboard(host_board), indent=2) + "\n"
    return out
