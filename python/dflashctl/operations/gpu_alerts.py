"""The GPU alert rules that carry GPU-health facts, generated from host/data/gpu-health.json.

dflash.rules.json's XID and throttling alerts, for each GPU exporter, are made here from the XID
verdicts and the clock event reasons that warn (with their texts and fixes), so the alert rules,
doctor, serve and the docs judge an XID alike: an XID that ends an instance is a critical alert,
one it serves on a warning. `python -m dflashctl.operations.gpu_alerts` rewrites those rules in the
package's rule file in place (tests/regenerate runs it; tests/operations/test_gpu_alerts.py fails
while the file is stale). What this module knows is each exporter's metric names and labels; the
other rules of the file (ECC, row remapping, memory, the instances, the router) are written by hand,
and the test holds their severity to the finding they alert on.
"""

import json
import sys

from dflashctl.host import gpu_health_data
from dflashctl.operations import unit_data

RULES_FILE = unit_data.DATA / "monitoring" / "dflash.rules.json"
GROUPS = {"dcgm-exporter": "dflash-gpus-dcgm-exporter", "nvidia_gpu_exporter": "dflash-gpus-nvidia-gpu-exporter"}
DCGM_XID, DCGM_CLOCKS = "DCGM_FI_DEV_XID_ERRORS", \
    '{__name__=~"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}'
NVSMI_XID = "nvidia_smi_xid_last_timestamp_seconds"
NVSMI_XID_WINDOW_S = 900  # the exporter keeps the last XID's time; an alert for 15 minutes after it
# How each exporter names a GPU, its index (for a fix's command) and where its figures come from.
EXPORTERS = {
    "dcgm-exporter": {
        "gpu": "GPU {{ $labels.gpu }} ({{ $labels.UUID }})", "index": "{{ $labels.gpu }}", "xid": "{{ $value }}",
        "xid-source": f"dcgm-exporter's {DCGM_XID} is the last XID the driver raised for this GPU.",
        "clocks-source": "NVML's clock-event reasons (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, "
                         "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS before DCGM 3.3; not in dcgm-exporter's default "
                         "counters: add the field to its collectors file)"},
    "nvidia_gpu_exporter": {
        "gpu": "GPU {{ $labels.uuid }}", "index": "N", "xid": "{{ $labels.xid }}",
        "xid-source": "nvidia_gpu_exporter (NVML backend) saw the driver raise this XID in the last 15 minutes "
                      "(nvidia_smi_gpu_info maps the uuid to the GPU's index N).",
        "clocks-source": "nvidia-smi's clocks_event_reasons"},
}


def xid_expr(exporter: str, verdict: str, failing: list[int]) -> str:
    """The XIDs of `verdict`: those in `failing` for fail, every other XID for warn."""
    if exporter == "dcgm-exporter":
        fail = " or ".join(f"{DCGM_XID} == {n}" for n in failing)
        return fail if verdict == "fail" else f"{DCGM_XID} > 0 unless ({fail})"
    match = "=~" if verdict == "fail" else "!~"
    return f'time() - {NVSMI_XID}{{xid{match}"{"|".join(map(str, failing))}"}} < {NVSMI_XID_WINDOW_S}'


def clocks_expr(exporter: str, reasons: list[dict]) -> str:
    if exporter == "dcgm-exporter":
        return "(" + " + ".join(f"floor({DCGM_CLOCKS} / {r['bit']}) % 2" for r in reasons) + ") > 0"
    names = "|".join(r["name"] for r in reasons)
    return f'max by (uuid) ({{__name__=~"nvidia_smi_clocks_event_reasons_({names})"}}) > 0'


def grouped_fixes(xids: list[dict], default: str, index: str) -> str:
    """One sentence per fix: "XID 48, 94 or 95: drain it, … ." """
    by_fix: dict[str, list[str]] = {}
    for x in xids:
        by_fix.setdefault(gpu_health_data.fill(x.get("fix") or default, i=index), []).append(str(x["xid"]))
    said = [f"XID {', '.join(n[:-1]) + ' or ' + n[-1] if len(n) > 1 else n[0]}: {fix}." for fix, n in by_fix.items()]
    return " ".join(said)


def facts(d: gpu_health_data.HealthData, kind: str, exporter: str) -> tuple[str, str, str]:
    """(expr, list, fixes) of the alert `kind` (xid-fail, xid-warn, clocks) for `exporter`."""
    e = EXPORTERS[exporter]
    if kind == "clocks":
        host = d.clock_reasons(host_only=True)
        listed = ", ".join(f"{r['what'].split(' (')[0]} ({r['bit']:#x})" for r in host)
        fixes = gpu_health_data.fill(gpu_health_data.join_fixes([r["fix"] for r in host]), i=e["index"])
        return clocks_expr(exporter, host), listed, fixes[:1].upper() + fixes[1:]
    verdict = kind.split("-")[1]
    xids = d.xids(verdict)
    listed = ", ".join(f"{x['xid']} {x['what']}" for x in xids)
    fixes = grouped_fixes(xids, d.data["fixes"]["journal"], e["index"])
    return xid_expr(exporter, verdict, [x["xid"] for x in d.xids("fail")]), listed, fixes


def rule(d: gpu_health_data.HealthData, kind: str, exporter: str) -> dict:
    a, e = d.data["alerts"][kind], EXPORTERS[exporter]
    expr, listed, fixes = facts(d, kind, exporter)
    source = e["clocks-source" if kind == "clocks" else "xid-source"]
    fields = {"gpu": e["gpu"], "xid": e["xid"], "source": source, "list": listed, "fixes": fixes}
    out = {"alert": a["names"][exporter], "expr": expr}
    if "for" in a:
        out["for"] = a["for"]
    out["labels"] = {"severity": a["severity"], "exporter": exporter}
    out["annotations"] = {k: gpu_health_data.fill(a[k], **fields) for k in ("summary", "description", "action")}
    return out


def generated(d: gpu_health_data.HealthData) -> dict[str, list[dict]]:
    """group name -> the rules made here for it, in the data's order."""
    return {group: [rule(d, kind, exporter) for kind in d.data["alerts"]] for exporter, group in GROUPS.items()}


def with_generated(rules: dict, d: gpu_health_data.HealthData) -> dict:
    """The rule file `rules` with its generated GPU alerts replaced (or added, before the first one there)."""
    made = generated(d)
    groups = []
    for g in rules["groups"]:
        mine = {r["alert"]: r for r in made.get(g["name"], [])}
        kept = [mine.pop(r["alert"], None) or r if "alert" in r else r for r in g["rules"]]
        groups.append({**g, "rules": list(mine.values()) + kept})
    return {**rules, "groups": groups}


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python -m dflashctl.operations.gpu_alerts (rewrites the package's "
              "data/monitoring/dflash.rules.json)", file=sys.stderr)
        return 2
    rules = with_generated(json.loads(RULES_FILE.read_text()), gpu_health_data.load())
    RULES_FILE.write_text(json.dumps(rules, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
