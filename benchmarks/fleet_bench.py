"""A fleet of three hosts upgraded by `ansible-playbook` under load, through one of the two serving paths.

    sudo .venv/bin/python benchmarks/fleet_bench.py                                # front router (docs/fleet.md, 1.)
    sudo .venv/bin/python benchmarks/fleet_bench.py --serving-path remote-workers  # routers with remoteWorkers (2.)
    sudo .venv/bin/python benchmarks/fleet_bench.py --json out.json

The fleet is tests/fleet_harness.py's (root: network namespaces on a bridge, sshd in each, two
stand-in instances per host under `dflashctl serve`, the real router; what tests/operations/test_fleet.py
runs). `front-router`: one router on the machine in front of the three host routers, every client
sends to it. `remote-workers`: each host's router also lists the other hosts' instances, and the
clients are spread over the three host routers (as a DNS name with three addresses would). Closed-loop
JSON /generate requests for --before seconds, then deploy/ansible/playbook.yml to a new build (one host
after the other), then --after seconds. Prints a Markdown table: requests and failures before, during
and after, p50/p99, the longest stretch without an answer, the distinct errors, the play's time, and
how often a host's rollout said it was waiting for another host's worker.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
from fleet_harness import ADMIN_KEY, Fleet, ansible_playbook, pip_env, requirements  # noqa: E402
from router_harness import Load, Router, generate_body, phase, request  # noqa: E402

from dflashctl.operations import upgrade_build  # noqa: E402

INSTANCES = {name: {"model": "standin-model", "port": port, "host": "0.0.0.0",
                    "environment": {"STANDIN_READY_AFTER": "1.0", "STANDIN_TOKEN_DELAY": "0.002"}}
             for name, port in (("gpu0", 30000), ("gpu1", 30001))}


def healthy_workers(fleet: Fleet) -> dict[str, int]:
    """Per host, how many workers its router has in rotation (its own and, with remoteWorkers, the others')."""
    out = {}
    for h, url in zip(fleet.hosts, fleet.router_urls()):
        status, body = request(url + "/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        out[h.name] = sum(w["is_healthy"] for w in json.loads(body)["workers"]) if status == 200 else -1
    return out


def loads(fleet: Fleet, front: Router | None, clients: int) -> list[Load]:
    urls = [front.url] if front is not None else fleet.router_urls()
    per = max(1, clients // len(urls))
    return [Load(u + "/generate", generate_body(16), clients=per, max_requests=10**8, seconds=3600).start()
            for u in urls]


def measure(args, tmp: Path) -> dict:
    reqs = {tag: requirements(tmp, tag, {}) for tag in ("v1", "v2")}
    os.environ.update(pip_env(tmp))

    def install(h):
        build = upgrade_build.pip_build(h.root, str(reqs["v1"]), None, sys._base_executable)
        upgrade_build.point_current(h.root, build.id)

    fleet, front = Fleet(tmp), None
    try:
        fleet.up(INSTANCES, dict(os.environ), install, remote_workers=args.serving_path == "remote-workers")
        if args.serving_path == "front-router":
            front = Router({"workers": fleet.router_urls()}, tmp).start()
            front.wait_healthy(fleet.router_urls(), timeout=120)
        workers_before = healthy_workers(fleet)
        running = loads(fleet, front, args.clients)
        time.sleep(args.before)
        t_play = time.monotonic()
        common = {"dflash_instances": INSTANCES, "dflash_requirements": str(reqs["v2"]),
                  "dflash_python": sys._base_executable, "dflash_dflashctl": str(Path(sys.executable).parent / "dflashctl"),
                  "dflash_rollout_args": ["--healthy-for", str(args.healthy_for)],
                  "dflash_environment": {**pip_env(tmp), "TMPDIR": os.environ.get("TMPDIR", "/tmp")}}
        r, seconds = ansible_playbook(fleet, REPO / "deploy" / "ansible" / "playbook.yml", tmp, common)
        t_done = time.monotonic()
        time.sleep(args.after)
        outcomes = [o for load in running for o in load.stop()]
        workers_after = healthy_workers(fleet)
    finally:
        if front is not None:
            front.stop()
        fleet.down()
    t0 = min(o.start for o in outcomes)
    waited = waits_for_other_hosts(r.stdout)
    return {"serving_path": args.serving_path, "play_ok": r.returncode == 0, "play_s": round(seconds, 1),
            "before": phase(outcomes, t0, t_play), "during": phase(outcomes, t_play, t_done),
            "after": phase(outcomes, t_done, t_done + args.after + 60),
            "rollout_waits_for_other_hosts_workers": waited,
            "workers_in_rotation_per_host_router": {"before": workers_before, "after": workers_after}}


def waits_for_other_hosts(play_output: str) -> dict[str, int]:
    """Per host, the rollout's lines saying it waited for a worker of another host (its router's
    remoteWorkers), from the step's stderr in the play's -v output."""
    out = {}
    for line in play_output.splitlines():
        head, sep, body = line.partition(" => ")
        if not sep or not head.startswith(("changed: [", "ok: [", "fatal: [")):
            continue
        try:
            result = json.loads(body)
        except ValueError:
            continue
        if "upgrade" in result.get("cmd", []):
            host = head.split("[", 1)[1].rstrip("]")
            out[host] = sum("waiting for http://10." in x for x in result.get("stderr_lines", []))
    return out


def table(result: dict) -> str:
    rows = ["| phase | requests | failed | p50 s | p99 s | longest without an answer s | errors |", "|---|---|---|---|---|---|---|"]
    for name in ("before", "during", "after"):
        p = result[name]
        rows.append(f"| {name} | {p['requests']} | {p['failed']} | {p['p50_s']} | {p['p99_s']} | "
                    f"{p['longest_without_answer_s']} | {'; '.join(p['errors']) or '-'} |")
    return (f"serving path {result['serving_path']}: ansible-playbook {'ok' if result['play_ok'] else 'FAILED'} in "
            f"{result['play_s']} s; lines of each host's rollout waiting for another host's worker: "
            f"{result['rollout_waits_for_other_hosts_workers']}; workers in rotation per host router "
            f"{result['workers_in_rotation_per_host_router']}\n" + "\n".join(rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serving-path", choices=("front-router", "remote-workers"), default="front-router")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--before", type=float, default=10.0)
    p.add_argument("--after", type=float, default=10.0)
    p.add_argument("--healthy-for", type=float, default=2.0)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as d:
        result = measure(args, Path(d))
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["play_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
