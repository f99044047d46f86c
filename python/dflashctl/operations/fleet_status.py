"""`dflashctl status --host NAME=FILE ...`: a fleet at a glance, from each host's `status --json`.

Each host reports itself (`dflashctl status --json` on the host, gathered by the fleet's engine:
`ansible dflash -m command -a 'dflashctl status --json'`, ssh, a cron job writing a file); this
reads those reports, never the hosts, so it needs no access to any of them. One row per host: its
verdict, instances healthy of all, the router's workers in and out of rotation, requests/s, the
lowest acceptance length of its instances, the report's age; then every problem prefixed with its
host. The exit code is 0 when every host is healthy, 1 otherwise, as for one host. `--json` gives
{"format": "dflashctl-fleet-status", "hosts": [...], "healthy", "exit_code", "problems"}.
"""

import calendar
import time

from dflashctl import inputs, output
from dflashctl.errors import FAILED, INPUT, OK, USAGE, DflashError

FORMAT, VERSION = "dflashctl-fleet-status", 1
HOST_FORMAT = "dflashctl-status"


def parse_hosts(values: list[str]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise DflashError(f"--host {v!r} is not NAME=FILE", "each host's `dflashctl status --json` saved in a file",
                              "e.g. --host gpu-a=gpu-a.json", USAGE)
        out.append((name, path))
    names = [n for n, _ in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DflashError(f"--host names {', '.join(twice)} twice", "each host once", "give each host its own name",
                          USAGE)
    return out


def read_report(name: str, path: str) -> dict:
    fix = f"save the host's report with `dflashctl status --json > {path}` on {name}"
    rep = inputs.read_json(path, "status report", fix, INPUT)
    if not isinstance(rep, dict) or rep.get("format") != HOST_FORMAT or not isinstance(rep.get("instances"), list):
        what = f"its \"format\" is {rep.get('format')!r}" if isinstance(rep, dict) else "it is not a JSON object"
        raise DflashError(f"{path} is not a `dflashctl status --json` report", what, fix, INPUT)
    return rep


def _age_s(rep: dict, now: float) -> float | None:
    try:
        return max(0.0, now - calendar.timegm(time.strptime(rep["time"], "%Y-%m-%dT%H:%M:%SZ")))
    except (KeyError, TypeError, ValueError):
        return None


def host_row(name: str, path: str, rep: dict, now: float) -> dict:
    instances = [i for i in rep["instances"] if isinstance(i, dict)]
    router = rep.get("router") if isinstance(rep.get("router"), dict) else None
    accepts = [i["accept_length"] for i in instances if isinstance(i.get("accept_length"), (int, float))]
    return {"name": name, "file": path, "reported_by": rep.get("host"), "time": rep.get("time"),
            "age_s": _age_s(rep, now), "healthy": rep.get("healthy") is True,
            "instances": len(instances), "instances_healthy": sum(i.get("healthy") is True for i in instances),
            "in_rotation": len(router["workers_in_rotation"]) if router else None,
            "out_of_rotation": len(router["workers_out_of_rotation"]) if router else None,
            "requests_per_s": router.get("requests_per_s") if router else None,
            "min_accept_length": min(accepts) if accepts else None,
            "problems": [p for p in rep.get("problems") or [] if isinstance(p, str)]}


def report(hosts: list[tuple[str, str]]) -> dict:
    now = time.time()
    rows = [host_row(name, path, read_report(name, path), now) for name, path in hosts]
    problems = [f"{r['name']}: {p}" for r in rows for p in r["problems"]]
    problems += [f"{r['name']}: unhealthy" for r in rows if not r["healthy"] and not r["problems"]]
    healthy = not problems
    return {"format": FORMAT, "version": VERSION, "hosts": rows, "healthy": healthy,
            "exit_code": OK if healthy else FAILED, "problems": problems}


def _cell(v, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def render(rep: dict) -> str:
    head = ["HOST", "VERDICT", "INSTANCES", "ROTATION", "REQ/S", "MIN ACCEPT", "REPORTED"]
    rows = [[r["name"], "healthy" if r["healthy"] else "UNHEALTHY", f"{r['instances_healthy']}/{r['instances']}",
             f"{_cell(r['in_rotation'])} in, {_cell(r['out_of_rotation'])} out",
             _cell(r["requests_per_s"], "{:.1f}"), _cell(r["min_accept_length"], "{:.2f}"),
             _cell(r["age_s"], "{:.0f} s ago")] for r in rep["hosts"]]
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    bad = sum(not r["healthy"] for r in rep["hosts"])
    lines.append(f"fleet: {len(rep['hosts']) - bad} of {len(rep['hosts'])} host(s) healthy")
    lines += [f"  {p}" for p in rep["problems"]]
    return "\n".join(lines)


def run(host_args: list[str], as_json: bool) -> int:
    rep = report(parse_hosts(host_args))
    if as_json:
        output.print_json(rep)
    else:
        output.emit(render(rep) + "\n")
    return rep["exit_code"]
