"""`dflashctl status`: a host at a glance, one row per instance and the router, healthy or not.

The instances are their settings as `dflashctl unit` (/etc/dflash/*.json) or the NixOS module
(/etc/dflash-instances.json) installed them, or `--instance FILE`; the router's are
/etc/dflash-router.json (or `--router`). status_collect.py reads each source; this module turns
samples into the report: rates over the samples' span (two samples `--window` apart, or the last
minute of `--watch`), the acceptance length against its alert threshold (operations/monitoring.py:
a quarter of the drafter's block, or --min-accept-length), and the verdict. The exit code is 0
when everything is healthy and 1 otherwise (a unit not running, an instance that does not answer,
a worker out of rotation, a collapsed acceptance while decoding, a GPU fault), so it runs as a
check; what could not be read is named but does not fail it. `--json` writes the report as
docs/status.schema.json describes it.
"""

import calendar
import glob
import json
import socket
import sys
import time
from pathlib import Path

from dflashctl import cli_help, output
from dflashctl.errors import CONFIG, FAILED, OK, USAGE, DflashError
from dflashctl.operations import monitoring, rollout_plan, router, status_collect, unit_data
from dflashctl.operations.status_collect import InstanceSample, RouterSample, Sample
from dflashctl.service import unit

FORMAT, VERSION = "dflashctl-status", 1
MODULE_SETTINGS = "/etc/dflash-instances.json"  # the NixOS module's settings of every instance
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


def instance_report(history: list[InstanceSample], times: list[float], min_accept: float | None) -> dict:
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
    model_path = (s.model_info or {}).get("model_path")
    return {
        "name": cfg.name, "unit": unit.unit_name(cfg), "url": cfg.base_url,
        "unit_state": _unit_json(state),
        "answers": s.answers,
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
        "healthy": not problems, "problems": problems, "missing": missing,
    }


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
    if decoding_accept is not None and min_accept is not None and decoding_accept < min_accept:
        problems.append(f"acceptance length {decoding_accept:.2f} below {min_accept:g} while decoding "
                        "(the drafter, a thinking chat template or the prompt mix: docs/monitoring.md)")
    for g in s.gpus:
        if g["health"] == "fault":
            problems.append(f"GPU {g['index']}: {g['health_detail']}")
    return problems


def _metric_or_loads(s: InstanceSample, metric: str, loads_key: str) -> int | None:
    v = _loads_value(s, loads_key)
    if v is None and s.metrics is not None and (m := s.metrics.total(metric)) is not None:
        v = int(m)
    return v


def router_report(history: list[RouterSample], times: list[float], instance_urls: dict[str, str]) -> dict:
    s = history[-1]
    problems, missing = [], list(s.missing)
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
        for w in workers_out:
            problems.append(f"worker {w['url']}{_named(w)} out of rotation (its health checks fail)")
        for w in not_listed:
            problems.append(f"worker {w['url']}{_named(w)} is not in the router's list (a stopped rollout "
                            "leaves it out: `dflashctl rollout --resume`; else `systemctl reload dflash-router`)")
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
        "healthy": not problems, "problems": problems, "missing": missing,
    }


def _named(w: dict) -> str:
    return f" (instance {w['instance']})" if w.get("instance") else ""


def report(samples: list[Sample], min_accept: dict[str, float | None], router_missing: str | None = None) -> dict:
    last = samples[-1]
    times = [s.at for s in samples]
    instances = []
    for i, inst in enumerate(last.instances):
        history = [s.instances[i] for s in samples]
        instances.append(instance_report(history, times, min_accept.get(inst.cfg.name)))
    urls = {inst.cfg.base_url: inst.cfg.name for inst in last.instances}
    rep_router = router_report([s.router for s in samples], times, urls) if last.router is not None else None
    problems = [f"{r['name']}: {p}" for r in instances for p in r["problems"]]
    if rep_router is not None:
        problems += [f"router: {p}" for p in rep_router["problems"]]
    healthy = not problems
    return {
        "format": FORMAT, "version": VERSION, "time": status_collect.iso(last.wall), "host": socket.gethostname(),
        "window_s": round(samples[-1].at - samples[0].at, 2),
        "systemd": last.systemd is None, "systemd_missing": last.systemd,
        "nvml": last.nvml is None, "nvml_missing": last.nvml,
        "instances": instances,
        "router": rep_router, "router_missing": None if last.router is not None else (
            router_missing or f"no router settings ({unit_data.router_unit_data()['settingsPath']} does not "
            "exist; --router FILE)"),
        "healthy": healthy, "exit_code": OK if healthy else FAILED, "problems": problems,
    }


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


def _not_read(rep: dict) -> list[str]:
    missing = [f"{r['name']}: {m}" for r in rep["instances"] for m in r["missing"]]
    if rep["nvml_missing"]:
        missing.insert(0, f"GPUs: {rep['nvml_missing']}")
    if rep["systemd_missing"]:
        missing.insert(0, f"systemd: {rep['systemd_missing']} (no unit state, restarts or journal)")
    if rep["router"] is not None:
        missing += [f"router: {m}" for m in rep["router"]["missing"]]
    return missing


# ------------------------------------------------------------------------------------- the command

def instance_files(given: list[str]) -> list[str]:
    if given:
        return given
    files = sorted(glob.glob(rollout_plan.SETTINGS_GLOB))
    if Path(MODULE_SETTINGS).exists():
        files.append(MODULE_SETTINGS)
    if not files:
        raise DflashError("no instances on this host", f"no --instance given, no {rollout_plan.SETTINGS_GLOB} and "
                          f"no {MODULE_SETTINGS}", "pass each instance's settings with --instance FILE", CONFIG)
    return files


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
                   help=f"an instance's settings or the module's dflash-instances.json (repeat; default: every "
                        f"{rollout_plan.SETTINGS_GLOB} and {MODULE_SETTINGS})")
    p.add_argument("--router", metavar="FILE", help="the router settings (default: "
                   f"{unit_data.router_unit_data()['settingsPath']} if it exists)")
    p.add_argument("--no-router", action="store_true", help="leave the router out")
    p.add_argument("--no-systemd", action="store_true", help="do not ask systemd (unit state, journal)")
    p.add_argument("--json", action="store_true", help="the report as JSON (docs/status.schema.json)")
    p.add_argument("--window", type=_seconds_or_zero, default=2.0, metavar="SEC",
                   help="seconds between the two samples rates come from (2; 0: one sample, no rates)")
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
    cfgs = rollout_plan.load_instances(instance_files(args.instance))
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

    def collect() -> Sample:
        return status_collect.sample(cfgs, rcfg, admin_key, key_problem, use_systemd=not args.no_systemd)

    if args.watch is None:
        samples = [collect()]
        if args.window > 0:
            time.sleep(args.window)
            samples.append(collect())
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
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            sys.stdout.write("\x1b[?25h\x1b[?1049l")
            sys.stdout.flush()
    return code
