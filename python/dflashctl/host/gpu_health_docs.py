"""docs/service.md's GPU tables, generated from data/gpu-health.json (gpu_health_data.py).

`python -m dflashctl.host.gpu_health_docs docs/service.md` rewrites them between their markers
(tests/regenerate runs it with the other generators; tests/host/test_gpu_health_data.py fails while
they are stale): what each finding does in doctor, serve's preflight and the GPU watch with its
fix, then NVML's clock event reasons and every XID with its verdict, the trusted lists' verdicts
and the reason.
"""

import sys
from pathlib import Path

from dflashctl.host import gpu_health_data, gpu_watch

SOURCE = "python/dflashctl/host/data/gpu-health.json"
FINDINGS = (f"<!-- GPU health findings: generated from {SOURCE} by `tests/regenerate`; edit the data, "
            "not the table -->", "<!-- end of the generated GPU health findings -->")
XIDS = (f"<!-- clock event reasons and XIDs: generated from {SOURCE} by `tests/regenerate`; edit the data, "
        "not the tables -->", "<!-- end of the generated clock event reasons and XIDs -->")
PREFLIGHT = {"fail": "exit 89", "warn": "starts, warns"}
SERVING = {"fail": "exit 94", "warn": "noted in the status, serves on", None: "—"}
XID_SERVING = {"fail": "exit 94 at once (the watch's XID event)", "warn": "noted in the status at once; serves on"}
VERDICT = {"fail": "fail (exit 94)", "warn": "warn (serves on)"}


def row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def numbers(xids: list[int]) -> str:
    """48, 94 or 95"""
    text = [str(x) for x in xids]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " or " + text[-1]


def serving_cell(f: dict) -> str:
    cell = SERVING[f["serving"]]
    if f["serving"] is None:
        return cell
    if "servingWhen" in f:
        return f"{cell} {f['servingWhen']}"
    every = f"every {gpu_watch.POLL_S:g} s"
    if f.get("xids"):
        return f"{cell}: at once on an XID {numbers(f['xids'])} event, else at the next reading ({every})"
    return f"{cell} at the next reading ({every})"


def fix_cell(d: gpu_health_data.HealthData, f: dict) -> str:
    """The fix an operator reads, {i} as N; a recovery action's and a clock reason's are their own."""
    if f.get("fixFrom") == "recoveryActions":
        return "; ".join(f"{a['what']}: {a['fix']}" for a in d.data["recoveryActions"]).replace("{i}", "N")
    if f.get("fixFrom") == "clockReasons":
        return gpu_health_data.join_fixes([r["fix"] for r in d.clock_reasons(host_only=True)])
    return f["fix"].replace("{i}", "N")


def clock_list(d: gpu_health_data.HealthData) -> str:
    return ", ".join(f"{r['what'].split(' (')[0]} ({r['bit']:#x})" for r in d.clock_reasons(host_only=True))


def findings_table(d: gpu_health_data.HealthData) -> str:
    lines = [row("what NVML says", "doctor", "preflight", "while serving", "what the operator does"),
             "|---|---|---|---|---|"]
    for f in d.data["findings"].values():
        when = gpu_health_data.fill(f["when"], reasons=clock_list(d)) if "{reasons}" in f["when"] else f["when"]
        lines.append(row(when, f["status"], PREFLIGHT[f["status"]], serving_cell(f), fix_cell(d, f)))
    for verdict, what in (("fail", "an XID that means the GPU failed"), ("warn", "an XID after which it serves on")):
        listed = ", ".join(str(x["xid"]) for x in d.xids(verdict))
        lines.append(row(f"{what} ({listed}; the XID table below)", "—", "—", XID_SERVING[verdict],
                         "each XID's own (below)"))
    return "\n".join(lines)


def xid_table(d: gpu_health_data.HealthData) -> str:
    lists = d.data["trustedLists"]
    lines = [row("XID", "verdict", "what it means", *(t["name"] for t in lists.values()), "why this verdict",
                 "what the operator does"), "|---" * (5 + len(lists)) + "|"]
    for x in d.data["xids"]:
        theirs = [d.list_verdict(name, x["xid"]) or "—" for name in lists]
        fix = (x.get("fix") or d.data["fixes"]["journal"]).replace("{i}", "N")
        lines.append(row(str(x["xid"]), VERDICT[x["verdict"]], x["what"], *theirs, x["reason"], fix))
    notes = "; ".join(f"{t['name']} {t['note']}" for t in lists.values())
    return "\n".join(lines) + f"\n\nThe trusted lists, as checked: {notes}; — is not among the XIDs checked."


def clock_table(d: gpu_health_data.HealthData) -> str:
    lines = [row("bit", "clock event reason", "verdict"), "|---|---|---|"]
    lines += [row(f"{r['bit']:#x}", r["what"], "warn (the host's doing)" if "fix" in r else "not a finding")
              for r in d.clock_reasons()]
    return "\n".join(lines)


def with_tables(text: str, d: gpu_health_data.HealthData) -> str:
    """`text` (docs/service.md) with both generated blocks replaced by the data's."""
    for (start, end), body in ((FINDINGS, findings_table(d)), (XIDS, clock_table(d) + "\n\n" + xid_table(d))):
        a, b = text.index(start), text.index(end)
        text = text[:a] + start + "\n" + body + "\n" + text[b:]
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dflashctl.host.gpu_health_docs docs/service.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    text = path.read_text()
    missing = [m for pair in (FINDINGS, XIDS) for m in pair if m not in text]
    if missing:
        print(f"{path} lacks the markers of its generated GPU tables: put each pair where its table goes, "
              "then run this again:\n" + "\n".join(missing), file=sys.stderr)
        return 1
    path.write_text(with_tables(text, gpu_health_data.load()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
