"""`dflashctl status`: a host at a glance, one row per instance and the router, healthy or not.

The instances are found as `dflashctl rollout` and `monitoring` find them (operations/instances.py:
`--instance FILE`, else /etc/dflash/*.json and /etc/dflash-instances.json); the router's settings
are /etc/dflash-router.json (or `--router`); the rollout's state is where `dflashctl rollout` keeps
it (or `--state-dir`). status_collect.py reads each source; this module turns samples into the
report: rates over the samples' span (two samples `--window` apart, the second only of the
/metrics that answered, or the last minute of `--watch`), the acceptance length against its alert
threshold (operations/monitoring.py: a quarter of the drafter's block, or --min-accept-length),
what a rollout is doing, and the verdict. The exit code is 0 when everything is healthy and 1
otherwise (a unit not running, an instance that does not answer or refuses its own API key, a
worker out of rotation, a collapsed acceptance while decoding, a fault on a GPU the instance uses,
a rollout that stopped and left instances out), so it runs as a check; what could not be read (an
API key this user may not read among it) is named but does not fail it, and what a running
rollout does on purpose (an instance restarting, out of the router) is a note, not a problem.
`--json` writes the report as docs/status.schema.json describes it.
"""

import calendar
import json
import socket
import sys
import time

from dflashctl import cli_help, output
from dflashctl.errors import FAILED, OK, USAGE, DflashError, Terminated
from dflashctl.operations import instances, monitoring, router, status_collect, unit_data
from dflashctl.operations.status_collect import InstanceSample, RolloutSample, RouterSample, Sample
from dflashctl.service import unit

FORMAT, VERSION = "dflashctl-status", 2
HISTORY_S = 60.0


# ------------------------------------------------------------------------------------- the report

def _rate(points: list[tuple[float, float | None]]) -> float | None:
    """Per second between the oldest and the newest (time, counter) that have a value; None with
    fewer than two, or when the counter went back (a restart)."""
    points = [(t, v) for t, v in points if v is not None]
    if len(points) < 2 or points[-1][0] <= points[0][0] or points[-1][1] < points[0][1]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _unit_json(state) -> dict | None:
    if state is None:
        return None
    since = None
    if state.state_since_monotonic_us:
        age = time.monotonic() - state.state_since_monotonic_us / 1e6
        since = status_collect.iso(time.time() - age) if age >= 0 else None
    return {"active": state.active, "sub": state.sub, "since": since, "since_text": state.state_since or None,
            "restarts": state.restarts, "exit_status": state.exit_status, "status_text": state.status_text or None}


def _loads_value(s: InstanceSample, key: str) -> int | None:
    agg = (s.loads or {}).get("aggregate") or {}
    v = agg.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _accept_from_loads(s: InstanceSample) -> float | None:
    ranks = (s.loads or {}).get("loads") or []
    values = [r["speculative"]["accept_length"] for r in ranks if isinstance(r, dict)
              and isinstance(r.get("speculative"), dict)
              and isinstance(r["speculative"].get("accept_length"), (int, float))]
    return max(values) if values else None


def instance_report(history: list[InstanceSample], times: list[float], min_accept: float | None,
                    in_rollout: dict | None = None) -> dict:
    """`in_rollout`: what a rollout does with this instance ({"state", "reason", "live"}), or None."""
    s = history[-1]
    cfg = s.cfg
    missing = list(s.missing)
    generated = [(t, h.metrics.total("sglang:generation_tokens_total") if h.metrics else None)
                 for t, h in zip(times, history)]
    tokens = _rate(generated)
    tok_source = "metrics" if tokens is not None else None
    if tokens is None and s.loads is not None and s.metrics is None:
        agg = (s.loads.get("aggregate") or {}).get("avg_throughput")
        if isinstance(agg, (int, float)):
            tokens, tok_source = float(agg), "loads"  # SGLang's last decode interval: stale when idle
    decoding = tokens is not None and tokens > 0 and tok_source == "metrics"
    accept, accept_source = _acceptance(cfg, s, history, generated)
    state = s.unit_state
    problems = _instance_problems(cfg, s, accept if decoding else None, min_accept)
    notes = []
    if in_rollout and in_rollout["live"]:  # down on purpose: said, not failed (a GPU fault still fails)
        notes = [f"{p} ({in_rollout['state']} by the rollout)" for p in problems if not _still_fails(p)]
        problems = [p for p in problems if _still_fails(p)]
    model_path = (s.model_info or {}).get("model_path")
    return {
        "name": cfg.name, "unit": unit.unit_name(cfg), "url": cfg.base_url,
        "unit_state": _unit_json(state),
        "answers": s.answers, "http_status": s.http_status,
        "gpus": s.gpus,
        "model": cfg.model, "model_revision": cfg.model_revision, "model_commit": status_collect.model_commit(cfg),
        "served_model": model_path,
        "draft_model": cfg.draft_model, "draft_model_revision": cfg.draft_model_revision,
        "algorithm": cfg.speculative.algorithm,
        "metrics": "on" if s.metrics is not None else ("off" if not cfg.enable_metrics else "unreadable"),
        "requests_running": _metric_or_loads(s, "sglang:num_running_reqs", "total_running_reqs"),
        "requests_queued": _metric_or_loads(s, "sglang:num_queue_reqs", "total_waiting_reqs"),
        "tokens_per_s": None if tokens is None else round(tokens, 2), "tokens_per_s_source": tok_source,
        "accept_length": None if accept is None else round(accept, 3), "accept_length_source": accept_source,
        "accept_length_min": min_accept,
        "last_error": s.last_error,
        "rollout": None if not in_rollout else {"state": in_rollout["state"], "reason": in_rollout["reason"]},
        "healthy": not problems, "problems": problems, "notes": notes, "missing": missing,
    }


def _still_fails(problem: str) -> bool:
    """What a rollout's restart does not explain: a GPU fault, a collapsed acceptance while decoding."""
    return problem.startswith(("GPU ", "acceptance length "))


def _acceptance(cfg, s: InstanceSample, history: list[InstanceSample], generated: list) -> tuple:
    """The acceptance length and where it came from: the gauge averaged over the samples in which
    tokens were generated, the idle gauge, /v1/loads, or (None, None)."""
    if cfg.speculative.algorithm is None:
        return None, None
    if s.metrics is not None and s.metrics.has("sglang:spec_accept_length"):
        readings = []  # the gauge of each sample up to which tokens were generated
        for (_, a), (_, b), h in zip(generated, generated[1:], history[1:]):
            if a is not None and b is not None and b > a and h.metrics is not None:
                readings.append(h.metrics.maximum("sglang:spec_accept_length"))
        readings = [r for r in readings if r is not None]
        if readings:
            return sum(readings) / len(readings), "metrics"
        return s.metrics.maximum("sglang:spec_accept_length"), "metrics, idle"
    if (v := _accept_from_loads(s)) is not None:
        return v, "loads"
    return None, None


def _instance_problems(cfg, s: InstanceSample, decoding_accept: float | None,
                       min_accept: float | None) -> list[str]:
    """What makes the instance unhealthy: its unit, no answer, acceptance below the floor while
    decoding (decoding_accept is None when it is not), a faulty GPU."""
    problems = []
    state = s.unit_state
    if state is not None and state.load == "loaded" and not state.ready:
        detail = f" (exit {state.exit_status})" if state.exit_status is not None else ""
        text = f": {state.status_text}" if state.status_text else ""
        problems.append(f"unit {state.active}/{state.sub}{detail}{text}")
    elif state is not None and state.load != "loaded":
        problems.append(f"unit {unit.unit_name(cfg)} is not installed")
    if not s.answers and not problems:
        problems.append(f"does not answer at {cfg.base_url}")
    problems += _http_problems(cfg, s)
    if decoding_accept is not None and min_accept is not None and decoding_accept < min_accept:
        problems.append(f"acceptance length {decoding_accept:.2f} below {min_accept:g} while decoding "
                        "(the drafter, a thinking chat template or the prompt mix: docs/monitoring.md)")
    for g in s.gpus:
        if g["health"] == "fault":
            problems.append(f"GPU {g['index']}: {g['health_detail']}")
    return problems


def _http_problems(cfg, s: InstanceSample) -> list[str]:
    """An instance that answers, but not as its settings say it should: a refused key it was
    given, a key it wants that its settings do not name, an error status. A refusal where this
    user could not read the key is no problem (named under missing: run as root)."""
    code = s.http_status
    if not s.answers or code == 200:
        return []
    if code in (401, 403) and s.key == "unreadable":
        return []
    if code in (401, 403) and s.key == "read":
        return [f"refuses the key in its apiKeyFile {cfg.api_key_file} (HTTP {code} at /model_info): the running "
                f"SGLang has another key; restart it to load the file's (`systemctl restart {unit.unit_name(cfg)}`), "
                "or put its key back in the file"]
    if code in (401, 403):
        return [f"wants an API key (HTTP {code} at /model_info) but its settings name no apiKeyFile: another "
                f"process listens at {cfg.base_url}, or the instance runs with settings other than these"]
    return [f"answers HTTP {code} at {cfg.base_url}/model_info (starting, or failing: its journal)"]


def _metric_or_loads(s: InstanceSample, metric: str, loads_key: str) -> int | None:
    v = _loads_value(s, loads_key)
    if v is None and s.metrics is not None and (m := s.metrics.total(metric)) is not None:
        v = int(m)
    return v


def router_report(history: list[RouterSample], times: list[float], instance_urls: dict[str, str],
                  roles: dict[str, dict] | None = None, rollout_unknown: str | None = None) -> dict:
    """`roles`: what a rollout does with each instance (rollout_roles); `rollout_unknown`: why a
    rollout state that is there could not be read (None: read, or there is none)."""
    s = history[-1]
    problems, notes, missing = [], [], list(s.missing)
    def counter(name: str) -> list[tuple[float, float | None]]:
        return [(t, h.metrics.total(name) if h.metrics else None) for t, h in zip(times, history)]
    state = s.unit_state
    if state is not None and state.load == "loaded" and not state.ready:
        problems.append(f"unit {state.active}/{state.sub}" + (f": {state.status_text}" if state.status_text else ""))
    workers_in, workers_out, not_listed = [], [], []
    if s.workers is not None:
        for url, healthy in sorted(s.workers.items()):
            (workers_in if healthy else workers_out).append({"url": url, "instance": instance_urls.get(url)})
        for url in s.cfg.workers:
            if url not in s.workers:
                not_listed.append({"url": url, "instance": instance_urls.get(url)})
        for w, listed in [(w, True) for w in workers_out] + [(w, False) for w in not_listed]:
            text, on_purpose = _worker_out(w, listed, (roles or {}).get(w["instance"]), roles, rollout_unknown)
            (notes if on_purpose else problems).append(text)
    elif s.unreachable:
        problems.append(f"does not answer at {s.cfg.url}")
    retries = s.metrics.total("smg_worker_retries_total") if s.metrics else None
    requests = _rate(counter("smg_router_requests_total"))
    return {
        "url": s.cfg.url, "unit_state": _unit_json(state),
        "workers_in_rotation": workers_in, "workers_out_of_rotation": workers_out, "workers_not_listed": not_listed,
        "requests_per_s": None if requests is None else round(requests, 3),
        "retries_per_s": None if (r := _rate(counter("smg_worker_retries_total"))) is None else round(r, 3),
        "retries_total": 0 if retries is None and s.metrics is not None else retries,
        "healthy": not problems, "problems": problems, "notes": notes, "missing": missing,
    }


def _worker_out(w: dict, listed: bool, role: dict | None, roles: dict | None,
                rollout_unknown: str | None) -> tuple[str, bool]:
    """What to say of a worker out of rotation (`listed`) or not in the router's list, and whether
    it is out on purpose. A worker a rollout took out is never sent to `systemctl reload
    dflash-router`: that would put it back without the rollout's checks."""
    where = f"worker {w['url']}{_named(w)}"
    if role is not None and role["live"]:
        return f"{where} is out of the router for the rollout ({role['state']}: {role['reason']})", True
    if role is not None:
        return (f"{where} is out of the router: the rollout that stopped left it out ({role['reason']}); fix "
                "that, then `dflashctl rollout --resume` (a router reload would put it back unchecked)"), False
    if listed:
        return f"{where} out of rotation (its health checks fail)", False
    live = next((r for r in (roles or {}).values() if r["live"]), None)
    if live is not None:
        return (f"{where} is not in the router's list, and a rollout is running ({live['by']}): let it "
                "finish, then `systemctl reload dflash-router` if it is still missing"), False
    if rollout_unknown:
        return (f"{where} is not in the router's list: a rollout may have left it out (its state could not "
                f"be read: {rollout_unknown}); if none did, `systemctl reload dflash-router`"), False
    return (f"{where} is not in the router's list (taken out through its admin API, or added to its "
            "settings without a reload; no rollout has it out): `systemctl reload dflash-router`"), False


def _named(w: dict) -> str:
    return f" (instance {w['instance']})" if w.get("instance") else ""


def report(samples: list[Sample], min_accept: dict[str, float | None], router_missing: str | None = None) -> dict:
    last = samples[-1]
    times = [s.at for s in samples]
    rollout = rollout_report(last.rollout)
    roles = rollout_roles(rollout)
    instances_ = []
    for i, inst in enumerate(last.instances):
        history = [s.instances[i] for s in samples]
        instances_.append(instance_report(history, times, min_accept.get(inst.cfg.name), roles.get(inst.cfg.name)))
    urls = {inst.cfg.base_url: inst.cfg.name for inst in last.instances}
    unknown = last.rollout_missing if last.rollout_unreadable else None
    rep_router = (router_report([s.router for s in samples], times, urls, roles, unknown)
                  if last.router is not None else None)
    problems = [f"{r['name']}: {p}" for r in instances_ for p in r["problems"]]
    if rep_router is not None:
        problems += [f"router: {p}" for p in rep_router["problems"]]
    problems += [f"rollout: {p}" for p in (rollout or {}).get("problems", [])]
    healthy = not problems
    return {
        "format": FORMAT, "version": VERSION, "time": status_collect.iso(last.wall), "host": socket.gethostname(),
        "window_s": round(samples[-1].at - samples[0].at, 2),
        "systemd": last.systemd is None, "systemd_missing": last.systemd,
        "nvml": last.nvml is None, "nvml_missing": last.nvml,
        "instances": instances_,
        "router": rep_router, "router_missing": None if last.router is not None else (
            router_missing or f"no router settings ({unit_data.router_unit_data()['settingsPath']} does not "
            "exist; --router FILE)"),
        "rollout": rollout, "rollout_missing": last.rollout_missing,
        "healthy": healthy, "exit_code": OK if healthy else FAILED, "problems": problems,
    }


def rollout_report(r: RolloutSample | None) -> dict | None:
    """What the rollout's state says, and whether that is a problem: one that stopped with
    instances out of the router, or one whose process is gone while its state says running."""
    if r is None:
        return None
    st = r.state
    pid, status = st.get("pid"), st.get("status")
    running = status == "running" and r.alive
    left = st.get("left_out") if isinstance(st.get("left_out"), dict) else {}
    left_out = [{"instance": n, "reason": str((v or {}).get("reason") or "no reason recorded"),
                 "url": (v or {}).get("url")} for n, v in sorted(left.items())]
    current = [str(c) for c in st.get("current") or []]
    when = _when(st.get("started"))
    who = f"the rollout started {when or 'at an unknown time'} (pid {pid})"
    problems = []
    if status == "running" and not r.alive:
        problems.append(f"{who} stopped without finishing: its state says running, but pid {pid} is no "
                        "rollout now (killed, or the host restarted); " + _left_text(left_out, current) +
                        "fix the cause if there was one, then `dflashctl rollout --resume`")
    elif not running and left_out:
        problems.append(f"{who} {status or 'stopped'} and " + _left_text(left_out, []) +
                        "fix the cause, then `dflashctl rollout --resume` (it starts with those)")
    return {"state_dir": r.dir, "status": status, "running": running, "pid": pid if isinstance(pid, int) else None,
            "started": when, "updated": _when(st.get("updated")), "current": current, "left_out": left_out,
            "problems": problems}


def _when(t) -> str | None:
    return status_collect.iso(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 else None


def _left_text(left_out: list[dict], current: list[str]) -> str:
    if not left_out and not current:
        return "it left nothing out of the router; "
    names = sorted({w["instance"] for w in left_out} | set(current))
    reasons = {w["instance"]: w["reason"] for w in left_out}
    return "left out of the router: " + "; ".join(f"{n} ({reasons.get(n, 'in its batch')})" for n in names) + "; "


def rollout_roles(rollout: dict | None) -> dict[str, dict]:
    """Each instance the rollout has out: {"state": "restarting" | "left out", "reason", "live": the
    rollout still runs, "by": which rollout}."""
    if rollout is None:
        return {}
    live = rollout["running"]
    by = f"pid {rollout['pid']}, started {rollout['started'] or '?'}"
    reasons = {w["instance"]: w["reason"] for w in rollout["left_out"]}
    names = set(reasons) | (set(rollout["current"]) if live or rollout["status"] == "running" else set())
    return {n: {"state": "restarting" if live and n in rollout["current"] else "left out",
                "reason": reasons.get(n, "in the batch it restarts"), "live": live, "by": by} for n in names}


# ------------------------------------------------------------------------------------------ text

def _age(iso_time: str | None) -> str:
    if not iso_time:
        return "-"
    secs = max(0, int(time.time() - calendar.timegm(time.strptime(iso_time, "%Y-%m-%dT%H:%M:%SZ"))))
    for unit_s, name in ((86400, "d"), (3600, "h"), (60, "min")):
        if secs >= unit_s:
            return f"{secs // unit_s} {name}"
    return f"{secs} s"


def _num(v, fmt: str = "{:g}") -> str:
    return "-" if v is None else fmt.format(v)


def _gpu_cell(gpus: list[dict]) -> str:
    if not gpus:
        return "?"
    cells = []
    for g in gpus:
        health = {"ok": "ok", "warn": "warn", "fault": "FAULT"}[g["health"]]
        if g["memory_total_mib"] is None:  # lost, or not counted: no memory to show, the verdict still
            cells.append(f"{g['index']}: ? {health}")
            continue
        cells.append(f"{g['index']}: {g['memory_used_mib'] / 1024:.1f}/{g['memory_total_mib'] / 1024:.0f} GiB {health}")
    return ", ".join(cells)


def render(rep: dict, color: bool = False) -> str:
    def paint(text: str, ok: bool) -> str:
        return f"\x1b[{32 if ok else 31}m{text}\x1b[0m" if color else text

    lines = _instance_table(rep["instances"], paint)
    rt = rep["router"]
    if rt is None:
        lines.append(f"router: none ({rep['router_missing']})")
    else:
        lines.append(paint(_router_line(rt), rt["healthy"]))
    if rep["rollout"] is not None:
        lines.append(paint(_rollout_line(rep["rollout"]), not rep["rollout"]["problems"]))
    notes = [f"{r['name']}: {n}" for r in rep["instances"] for n in r["notes"]]
    notes += [f"router: {n}" for n in (rt or {}).get("notes", [])]
    if notes:
        lines += ["notes (a running rollout does this on purpose):"] + [f"  {n}" for n in notes]
    missing = _not_read(rep)
    if missing:
        lines += ["not read:"] + [f"  {m}" for m in missing]
    if rep["healthy"]:
        lines.append(paint("healthy", True))
    else:
        lines += [paint("UNHEALTHY:", False)] + [paint(f"  {p}", False) for p in rep["problems"]]
    return "\n".join(lines)


def _instance_table(instances: list[dict], paint) -> list[str]:
    head = ["INSTANCE", "UNIT", "SINCE", "RESTARTS", "GPU", "MODEL", "ALGORITHM", "RUN/QUEUE", "TOK/S", "ACCEPT",
            "LAST ERROR"]
    rows = []
    for r in instances:
        u = r["unit_state"]
        unit_cell = f"{u['active']}/{u['sub']}" if u else ("answers" if r["answers"] else "no answer")
        rev = r["model_commit"] or r["model_revision"]
        model = r["model"] + (f"@{rev[:12]}" if rev else "")
        accept = "-"
        if r["accept_length"] is not None:
            accept = f"{r['accept_length']:.2f}" + (f" (min {r['accept_length_min']:g})" if r["accept_length_min"] else "")
            if r["accept_length_source"] == "metrics, idle":
                accept += " idle"
        err = r["last_error"]["text"] if r["last_error"] else "-"
        rows.append(([r["name"], unit_cell, _age(u["since"]) if u else "-", _num(u["restarts"]) if u else "-",
                      _gpu_cell(r["gpus"]), model, r["algorithm"] or "none",
                      f"{_num(r['requests_running'])}/{_num(r['requests_queued'])}",
                      _num(r["tokens_per_s"], "{:.1f}"), accept, err if len(err) <= 70 else err[:67] + "..."],
                     r["healthy"]))
    widths = [max(len(head[i]), *(len(c[i]) for c, _ in rows)) for i in range(len(head) - 1)] if rows else []
    if not rows:
        return ["no instances"]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  " + head[-1]]
    for cells, ok in rows:
        lines.append(paint("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1], ok))
    return lines


def _router_line(rt: dict) -> str:
    u = rt["unit_state"]
    state = f"{u['active']}/{u['sub']} since {_age(u['since'])}" if u else "unit state not read"
    named = lambda ws: ", ".join(f"{w['instance'] or w['url']}" for w in ws) or "none"  # noqa: E731
    out = named(rt["workers_out_of_rotation"])
    parts = [f"router {rt['url']}: {state}",
             f"in rotation: {named(rt['workers_in_rotation'])}",
             f"out: {out}" + (f" ({', '.join(w['url'] for w in rt['workers_out_of_rotation'])})"
                              if rt["workers_out_of_rotation"] else "")]
    if rt["workers_not_listed"]:
        parts.append(f"not listed: {named(rt['workers_not_listed'])}")
    parts.append(f"{_num(rt['requests_per_s'], '{:.1f}')} req/s")
    parts.append(f"{_num(rt['retries_per_s'], '{:.2f}')} retries/s ({_num(rt['retries_total'])} total)")
    return "; ".join(parts)


def _rollout_line(ro: dict) -> str:
    state = "running" if ro["running"] else ("stopped: its process is gone" if ro["status"] == "running"
                                              else ro["status"] or "?")
    parts = [f"rollout (pid {ro['pid']}, started {_age(ro['started'])} ago): {state}"]
    if ro["running"]:
        parts.append(f"restarting: {', '.join(ro['current']) or 'between instances'}")
    if ro["left_out"]:
        parts.append(f"left out: {', '.join(w['instance'] for w in ro['left_out'])}")
    return "; ".join(parts)


def _not_read(rep: dict) -> list[str]:
    missing = [f"{r['name']}: {m}" for r in rep["instances"] for m in r["missing"]]
    if rep["nvml_missing"]:
        missing.insert(0, f"GPUs: {rep['nvml_missing']}")
    if rep["systemd_missing"]:
        missing.insert(0, f"systemd: {rep['systemd_missing']} (no unit state, restarts or journal)")
    if rep["router"] is not None:
        missing += [f"router: {m}" for m in rep["router"]["missing"]]
    if rep["rollout"] is None and rep["rollout_missing"] and not rep["rollout_missing"].startswith("no rollout"):
        missing.append(f"rollout: {rep['rollout_missing']}")
    return missing


# ------------------------------------------------------------------------------------- the command

def thresholds(cfgs, given: dict[str, float]) -> dict[str, float | None]:
    blocks = monitoring.drafter_block_sizes(cfgs)
    out = {}
    for c in cfgs:
        block = monitoring.block_size(c, blocks.get(c.name))
        out[c.name] = given.get(c.name, monitoring.min_accept_length(block) if block is not None else None)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("status", help="every instance and the router of this host: state, load, acceptance",
                              **cli_help.texts("status", __doc__))
    p.add_argument("--instance", action="append", default=[], metavar="FILE",
                   help=f"an instance's settings or the module's dflash-instances.json (repeat; default: "
                        f"{instances.DEFAULT_TEXT})")
    p.add_argument("--router", metavar="FILE", help="the router settings (default: "
                   f"{unit_data.router_unit_data()['settingsPath']} if it exists)")
    p.add_argument("--no-router", action="store_true", help="leave the router out")
    p.add_argument("--no-systemd", action="store_true", help="do not ask systemd (unit state, journal)")
    p.add_argument("--state-dir", metavar="DIR", help="where the rollout keeps its state (default: where "
                   "`dflashctl rollout` keeps it for this user, then /var/lib/dflash-rollout)")
    p.add_argument("--json", action="store_true", help="the report as JSON (docs/status.schema.json)")
    p.add_argument("--window", type=_seconds_or_zero, default=2.0, metavar="SEC",
                   help="seconds between the two samples rates come from (2; 0: one sample, no rates); "
                        "no wait when no /metrics answered")
    p.add_argument("--watch", nargs="?", type=cli_help.positive_float, const=2.0, metavar="SEC",
                   help="refresh every SEC seconds (2), in place on a terminal (--json: one object a line); "
                        "rates over the last minute")
    p.add_argument("--count", type=cli_help.positive_int, metavar="N", help="with --watch: stop after N refreshes")
    p.add_argument("--min-accept-length", action="append", default=[], metavar="NAME=X",
                   help="NAME is unhealthy below this acceptance length while decoding (default: the alert's)")
    p.add_argument("--host", action="append", default=[], metavar="NAME=FILE",
                   help="a fleet: each host's saved `status --json` (repeat); one row per host (fleet_status.py)")
    p.set_defaults(func=run)


def _seconds_or_zero(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else cli_help.positive_float(text)


def run(args) -> int:
    if args.host:
        from dflashctl.operations import fleet_status  # a fleet's reports: this host is not read
        return fleet_status.run(args.host, args.json)
    if args.count is not None and args.watch is None:
        raise DflashError("--count without --watch", "it counts the refreshes of --watch",
                          "add --watch, or leave --count out", USAGE)
    given = monitoring.name_values(args.min_accept_length, "--min-accept-length", monitoring.accept_length,
                                   "qwen3=3.5")
    cfgs = instances.load(args.instance)
    monitoring.unknown_instances(given, cfgs, "--min-accept-length")
    rcfg = monitoring.router_settings(args.router, args.no_router)
    admin_key, key_problem = None, None
    if rcfg is not None and rcfg.admin_api_key_file:
        try:
            _, admin_key = router.read_keys(rcfg, {})
        except DflashError as e:
            key_problem = f"{e.what} ({e.why}): run as root to list the workers"
    floors = thresholds(cfgs, given)
    no_router = "--no-router" if args.no_router else None

    dirs = status_collect.rollout_dirs(args.state_dir)

    def collect() -> Sample:
        return status_collect.sample(cfgs, rcfg, admin_key, key_problem, use_systemd=not args.no_systemd,
                                     state_dirs=dirs)

    if args.watch is None:
        samples = [collect()]
        if args.window > 0 and status_collect.has_counters(samples[0]):  # else nothing to rate: no wait
            time.sleep(args.window)
            samples.append(status_collect.resample(samples[0]))
        rep = report(samples, floors, no_router)
        if args.json:
            output.print_json(rep)
        else:
            output.emit(render(rep, color=sys.stdout.isatty()) + "\n")
        return rep["exit_code"]
    return watch(args, collect, floors, no_router)


def watch(args, collect, floors, no_router: str | None) -> int:
    tty = sys.stdout.isatty() and not args.json
    history: list[Sample] = []
    code, shown = OK, 0
    if tty:
        sys.stdout.write("\x1b[?1049h\x1b[?25l")  # the terminal's alternate screen, cursor hidden
    try:
        while True:
            history.append(collect())
            while len(history) > 2 and history[-1].at - history[0].at > HISTORY_S:
                history.pop(0)
            rep = report(history, floors, no_router)
            code = rep["exit_code"]
            if args.json:
                output.emit(json.dumps(rep) + "\n")
            elif tty:
                output.emit("\x1b[H\x1b[2J" + render(rep, color=True) +
                            f"\n\nevery {args.watch:g} s, rates over {rep['window_s']:g} s; Ctrl-C to quit")
            else:
                output.emit(f"== {rep['time']}\n{render(rep)}\n\n")
            shown += 1
            if args.count is not None and shown >= args.count:
                break
            time.sleep(args.watch)
    except (KeyboardInterrupt, Terminated):  # how a watch ends: the last report stands
        pass
    finally:
        if tty:
            sys.stdout.write("\x1b[?25h\x1b[?1049l")
            sys.stdout.flush()
    return code
