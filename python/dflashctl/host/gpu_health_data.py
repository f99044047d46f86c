"""The GPU health facts (data/gpu-health.json): each XID's verdict and why, each NVML figure's verdicts
and thresholds, and every text an operator reads about a GPU, once.

gpu_health.py judges NVML's figures with them; gpu_health_docs.py renders docs/service.md's GPU
tables from them and operations/gpu_alerts.py the GPU alert rules (tests/regenerate runs both).
This module reads and checks the file, expands the named fixes (`{reset}`) and fills a text's
figures; it judges nothing.
"""

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).with_name("data") / "gpu-health.json"
STATUSES = ("fail", "warn")  # a finding's verdict: preflight refuses (89) or starts and warns
SERVING = ("fail", "warn", None)  # what the GPU watch does on it: ends the instance (94), notes it, nothing
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def fill(text: str, **figures) -> str:
    """`text` with each {name} replaced by figures[name]; a name the caller did not give is an error
    (a typo in the data must not reach an operator as a literal brace)."""
    def one(m: re.Match) -> str:
        if m[1] not in figures:
            raise KeyError(f"gpu-health.json: no figure {m[1]!r} for {text!r}")
        return str(figures[m[1]])
    return PLACEHOLDER.sub(one, text)


def join_fixes(fixes: list[str]) -> str:
    """Fixes as one text, each step once (two clock reasons both ask to check the cooling)."""
    return "; ".join(dict.fromkeys(step for fix in fixes for step in fix.split("; ")))


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per file read
class HealthData:
    data: dict  # the file as read, its named fixes expanded

    def finding(self, key: str) -> dict:
        return self.data["findings"][key]

    def text(self, name: str, **figures) -> str:
        return fill(self.data["texts"][name], **figures)

    def xid(self, number: int) -> dict | None:
        return next((x for x in self.data["xids"] if x["xid"] == number), None)

    def xids(self, verdict: str) -> list[dict]:
        return [x for x in self.data["xids"] if x["verdict"] == verdict]

    def recovery(self, action: int) -> dict:
        known = next((a for a in self.data["recoveryActions"] if a["value"] == action), None)
        return known or self.data["recoveryActionUnknown"]

    def clock_reasons(self, host_only: bool = False) -> list[dict]:
        """nvmlClocksEventReason* bits; `host_only`: those that are the host's doing (they carry a fix)."""
        return [r for r in self.data["clockReasons"] if "fix" in r or not host_only]

    def list_verdict(self, name: str, xid: int) -> str | None:
        """'fatal', 'not fatal' or None (not known) for `xid` in the trusted list `name`."""
        t = self.data["trustedLists"][name]
        if xid in t["fatal"]:
            return "fatal"
        if xid in t["notFatal"]:
            return "not fatal"
        return {True: "fatal", False: "not fatal", None: None}[t["othersFatal"]]


def _expand(node, fixes: dict):
    """Every string under `node` with the named fixes ({reset}) written out; {i} and the figures stay."""
    if isinstance(node, str):
        return PLACEHOLDER.sub(lambda m: fixes.get(m[1], m[0]), node)
    if isinstance(node, list):
        return [_expand(x, fixes) for x in node]
    if isinstance(node, dict):
        return {k: _expand(v, fixes) for k, v in node.items()}
    return node


def _finding_problems(data: dict) -> list[str]:
    out, numbers = [], {x.get("xid") for x in data["xids"]}
    for key, f in data["findings"].items():
        if f.get("status") not in STATUSES:
            out.append(f"finding {key}: status {f.get('status')!r} is not one of {', '.join(STATUSES)}")
        if f.get("serving", "missing") not in SERVING:
            out.append(f"finding {key}: serving {f.get('serving', 'missing')!r} is not fail, warn or null")
        out += [f"finding {key}: no {k}" for k in ("key", "when", "what") if not f.get(k)]
        if not f.get("fix") and f.get("fixFrom") not in ("recoveryActions", "clockReasons"):
            out.append(f"finding {key}: no fix (or fixFrom: recoveryActions, clockReasons)")
        for n in f.get("xids", []):
            x = next((x for x in data["xids"] if x.get("xid") == n), None)
            if n not in numbers:
                out.append(f"finding {key}: XID {n} is not among the xids")
            elif x["verdict"] != f.get("serving"):
                out.append(f"finding {key}: XID {n}'s verdict is {x['verdict']}, but the watch does "
                           f"{f.get('serving')} on the finding it raises")
    return out


def _xid_problems(data: dict) -> list[str]:
    out, numbers = [], [x.get("xid") for x in data["xids"]]
    out += [f"XID {n}: listed twice" for n in sorted({n for n in numbers if numbers.count(n) > 1})]
    if numbers != sorted(numbers):
        out.append("xids: keep them in ascending order (the docs table follows it)")
    lists = HealthData(data)
    for x in data["xids"]:
        n = x.get("xid")
        if x.get("verdict") not in STATUSES:
            out.append(f"XID {n}: verdict {x.get('verdict')!r} is not one of {', '.join(STATUSES)}")
        out += [f"XID {n}: no {k}" for k in ("what", "reason") if not x.get(k)]
        ours = "fatal" if x.get("verdict") == "fail" else "not fatal"
        for name, t in data["trustedLists"].items():
            theirs = lists.list_verdict(name, n)
            if theirs not in (None, ours) and t["name"] not in x.get("reason", ""):
                out.append(f"XID {n}: {t['name']} counts it {theirs}, the verdict here is {x.get('verdict')}: "
                           f"say why in its reason, naming {t['name']}")
    return out


def _fix_problems(data: dict) -> list[str]:
    """A fix may hold only {i} once the named fixes are written out: any other name is a typo."""
    texts = [(f"finding {k}", f[k2]) for k, f in data["findings"].items() for k2 in ("fix", "servingFix") if k2 in f]
    texts += [(f"XID {x.get('xid')}", x["fix"]) for x in data["xids"] if "fix" in x]
    texts += [(f"clock reason {r['bit']:#x}", r["fix"]) for r in data["clockReasons"] if "fix" in r]
    texts += [(f"recovery action {a['value']}", a["fix"]) for a in data["recoveryActions"]]
    return [f"{where}: unknown name {{{n}}} in its fix (named fixes: {', '.join(data['fixes'])})"
            for where, text in texts for n in PLACEHOLDER.findall(text) if n != "i"]


def from_data(raw: dict) -> HealthData:
    data = _expand(raw, raw["fixes"])
    problems = _finding_problems(data) + _xid_problems(data) + _fix_problems(data)
    if problems:
        raise ValueError("gpu-health.json: " + "; ".join(problems))
    return HealthData(data)


@cache
def load(path: Path = DATA_FILE) -> HealthData:
    return from_data(json.loads(Path(path).read_text()))
