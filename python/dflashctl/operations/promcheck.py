"""What Prometheus refuses in the files `dflashctl monitoring` writes, checked before they are written.

Prometheus loads a rule file whole or not at all: one bad `for:` and every alert of the host stops,
and Prometheus says so only in its own log. So each value is held to the rule Prometheus (2.x)
applies to it, and the finished files are checked again before anything is written:

- durations (`for:`, `scrape_interval`) as prometheus/common's ParseDuration reads them: whole
  numbers with the units y, w, d, h, m, s, ms, largest first, each at most once, "0" alone, and at
  most 2^63-1 nanoseconds ("duration out of range");
- label names (`[a-zA-Z_][a-zA-Z0-9_]*`) and recorded series' names (metric names, `:` allowed);
- a rule file: named groups, each name once; each rule one of `record` or `alert`, `for:` only
  on an alert, and only the keys Prometheus' strict parser knows;
- PromQL: an expression is either one shipped in data/monitoring/dflash.rules.json (tier 1
  runs `promtool check rules` over it) or the one form this package generates, `vector(N)` with N
  a positive number as `monitoring._number` writes it; anything else is refused, since no parser
  of PromQL runs here;
- a scrape target: `host:port` with a DNS name, an IPv4 address or a bracketed IPv6 address and a
  port 1-65535. Prometheus' config check refuses only an empty target; the rest it takes and then
  cannot scrape (no port: it adds :80; `h:99999`: "invalid port"; `a b:80`: "invalid URL escape").

The NixOS module's twin of the duration rule is `durationProblem` in nix/lib/monitoring.nix
(tests/operations/test_monitoring.py holds both, and promtool, to one verdict).
"""

import ipaddress
import re

_DURATION = re.compile(r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
                       r"(?:([0-9]+)ms)?")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)  # y w d h m s ms
MAX_NS = 2 ** 63 - 1  # Go's time.Duration
DURATION_HELP = ("whole numbers with the units y, w, d, h, m, s, ms, largest first, each once: "
                 "30s, 10m, 1h30m")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
GENERATED_EXPR = re.compile(r"vector\(([0-9]+\.[0-9]+)\)")
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?")
_RULE_KEYS = {"record", "alert", "expr", "for", "labels", "annotations"}
_GROUP_KEYS = {"name", "interval", "rules", "limit"}


def duration_ns(text: str) -> int | None:
    """The duration in nanoseconds, as Prometheus reads it; None where it refuses it."""
    if text == "0":
        return 0
    m = _DURATION.fullmatch(text) if text else None
    if m is None:
        return None
    total = sum(int(n) * ms * 1_000_000 for n, ms in zip(m.groups(), _UNIT_MS) if n is not None)
    return total if total <= MAX_NS else None


def duration_problem(text) -> str | None:
    """Why Prometheus refuses `text` as a duration; None when it takes it."""
    if not isinstance(text, str):
        return f"{text!r} is not a duration (a string such as 10m)"
    if text == "":
        return "an empty duration"
    if duration_ns(text) is not None:
        return None
    if _DURATION.fullmatch(text):
        return f"{text!r} is out of range (Prometheus' durations end at about 292 years)"
    return f"{text!r} is not a duration Prometheus reads ({DURATION_HELP})"


def target_problem(text) -> str | None:
    """Why Prometheus cannot scrape `text` as written; None for a host:port it can."""
    if not isinstance(text, str) or not text:
        return "an empty target (Prometheus: \"no address\")"
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            return f"{text!r}: an IPv6 address is written [ADDRESS]:PORT"
        if "%" in host:
            return f"{text!r}: an IPv6 zone (%...) does not reach Prometheus' scrape URL as written"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{text!r}: {host!r} is not an IPv6 address"
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            return f"{text!r} has no port (Prometheus would scrape port 80): write HOST:PORT"
        if ":" in host:
            return f"{text!r}: an IPv6 address goes in brackets, [ADDRESS]:PORT"
        if not _HOSTNAME.fullmatch(host):
            return f"{text!r}: {host!r} is not a host name or an IPv4 address"
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"{text!r}: the port {port!r} is not 1-65535"
    return None


def threshold_problem(text: str) -> str | None:
    """A `vector(N)` threshold the way monitoring writes it: N must not round to 0."""
    m = GENERATED_EXPR.fullmatch(text)
    if m is None:
        return f"{text!r} is not an expression dflashctl generates"
    if float(m.group(1)) <= 0:
        return f"{text!r}: the threshold rounds to 0 at six decimals"
    return None


def _labels_problems(where: str, labels, names_only: bool = False) -> list[str]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [f"{where}: labels are not a mapping"]
    out = []
    for k, v in labels.items():
        if not (isinstance(k, str) and LABEL.fullmatch(k)) or k == "__name__":
            out.append(f"{where}: {k!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if not names_only and not isinstance(v, str):
            out.append(f"{where}: the value of {k!r} is not a string")
    return out


def rule_problems(where: str, rule, shipped_exprs: set[str]) -> list[str]:
    """What Prometheus' rule parser refuses in one rule."""
    if not isinstance(rule, dict):
        return [f"{where}: not a mapping"]
    out = [f"{where}: unknown field {k!r}" for k in sorted(set(rule) - _RULE_KEYS)]
    record, alert = rule.get("record"), rule.get("alert")
    if bool(record) == bool(alert):
        out.append(f"{where}: needs exactly one of 'record' and 'alert'")
    if record and not (isinstance(record, str) and METRIC.fullmatch(record)):
        out.append(f"{where}: {record!r} is not a name a recorded series can have")
    if record and ("for" in rule or "annotations" in rule):
        out.append(f"{where}: a recording rule has no 'for' or 'annotations'")
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr:
        out.append(f"{where}: no expression")
    elif expr not in shipped_exprs and (p := threshold_problem(expr)):
        out.append(f"{where}: {p}")
    if "for" in rule and (p := duration_problem(rule["for"])):
        out.append(f"{where}: for: {p}")
    out += _labels_problems(where, rule.get("labels"))
    out += _labels_problems(f"{where} annotations", rule.get("annotations"), names_only=True)
    return out


def rule_file_problems(rules, shipped: dict) -> list[str]:
    """What Prometheus refuses in a rule file (`shipped`: dflash.rules.json, whose expressions are
    promtool-checked in tier 1)."""
    exprs = {r.get("expr") for g in shipped["groups"] for r in g["rules"]}
    groups = rules.get("groups") if isinstance(rules, dict) else None
    if not isinstance(groups, list):
        return ["no list of groups"]
    out, names = [], set()
    for i, g in enumerate(groups):
        name = g.get("name") if isinstance(g, dict) else None
        where = f"group {name or i}"
        if not isinstance(name, str) or not name:
            out.append(f"{where}: no name")
        elif name in names:
            out.append(f"{where}: the name is used twice")
        names.add(name)
        if not isinstance(g, dict) or not isinstance(g.get("rules"), list):
            out.append(f"{where}: no list of rules")
            continue
        out += [f"{where}: unknown field {k!r}" for k in sorted(set(g) - _GROUP_KEYS)]
        for j, r in enumerate(g["rules"]):
            label = r.get("alert") or r.get("record") if isinstance(r, dict) else None
            out += rule_problems(f"{where}, rule {label or j}", r, exprs)
    return out


def scrape_problems(jobs) -> list[str]:
    """What Prometheus refuses, or cannot scrape, in a list of scrape_configs."""
    if not isinstance(jobs, list):
        return ["scrape_configs is not a list"]
    out, names = [], set()
    for i, job in enumerate(jobs):
        name = job.get("job_name") if isinstance(job, dict) else None
        where = f"job {name or i}"
        if not isinstance(name, str) or not name or name in names:
            out.append(f"{where}: a job needs a name of its own")
            continue
        names.add(name)
        p = duration_problem(job.get("scrape_interval", "1m"))
        if p or duration_ns(job.get("scrape_interval", "1m")) == 0:
            out.append(f"{where}: scrape_interval: {p or 'zero'}")
        if not str(job.get("metrics_path", "/")).startswith("/"):
            out.append(f"{where}: metrics_path must start with /")
        for group in job.get("static_configs", []):
            labels = group.get("labels")
            out += _labels_problems(where, labels)
            out += [f"{where}{_which(labels)}: {p}" for t in group.get("targets", [])
                    if (p := target_problem(t))]
    return out


def _which(labels) -> str:
    return "".join(f" ({k} {v})" for k, v in (labels or {}).items())
