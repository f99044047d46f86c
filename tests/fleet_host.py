"""`fleet_host.py HOSTDIR`: one host of tests/fleet_harness.py's fleet, run inside the host's network namespace.

What a GPU host without systemd runs, with stand-ins only for SGLang: every instance in
HOSTDIR/etc/dflash/*.json as `dflashctl serve` (the real supervisor) under tests/rollout_harness.py's
Supervisor (what the host's process manager does: READY=1 seen, a crash restarted), each started
on the build `HOSTDIR/opt/dflash/current` points at, resolved at each start as docs/fleet.md tells
a supervisor to do; and the real router (`dflashctl router`, sglang-router 0.3.2) on 0.0.0.0:30080
in front of them. Each namespace has its own loopback and ports, so every host uses the same
ports, as real hosts do. It writes HOSTDIR/agent.json (the restart command for `dflashctl
rollout --restart-command`, the router's settings file) once everything serves, appends every
start, ready and exit of an instance to HOSTDIR/events.jsonl (time.monotonic() is the machine's,
comparable across namespaces), and stops everything on SIGTERM.
"""

import json
import signal
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fleet_harness import ADMIN_KEY  # noqa: E402
from rollout_harness import Supervisor  # noqa: E402
from router_harness import ENV, Router  # noqa: E402

ROUTER_PORT, ROUTER_METRICS_PORT = 30080, 30081
# The supervisor's command for an instance: `current` resolved at each start, so an instance that is
# restarted runs the build `current` names then, and one left running keeps the build it started on.
START = ('exec "$0" -m dflashctl serve --config "$1" --skip-preflight '
         '--python "$(readlink -f "$2")/bin/python"')


def log_events(sup: Supervisor, path: Path, stop: threading.Event) -> None:
    seen = {name: 0 for name in sup.instances}
    while not stop.is_set():
        lines = []
        for name, inst in sup.instances.items():
            for t, what in inst.events[seen[name]:]:
                lines.append(json.dumps({"t": t, "instance": name, "event": what}))
            seen[name] = len(inst.events)
        if lines:
            with path.open("a") as f:
                f.write("\n".join(lines) + "\n")
        stop.wait(0.1)


def main() -> int:
    host_dir = Path(sys.argv[1])
    files = sorted((host_dir / "etc" / "dflash").glob("*.json"))
    sup = Supervisor(host_dir / "run")
    current = host_dir / "opt" / "dflash" / "current"
    for f in files:
        name = json.loads(f.read_text())["name"]
        sup.add(name, ["/bin/sh", "-c", START, sys.executable, str(f), str(current)],
                dict(ENV, LOGS_DIRECTORY=str(host_dir / "run")))
    stop = threading.Event()
    threading.Thread(target=log_events, args=(sup, host_dir / "events.jsonl", stop), daemon=True).start()
    sup.serve_control().start_all()
    urls = [f"http://127.0.0.1:{json.loads(f.read_text())['port']}" for f in files]
    remote = host_dir / "remote-workers.json"  # other hosts' instances, the router's remoteWorkers
    remote_urls = json.loads(remote.read_text()) if remote.exists() else []
    key = host_dir / "admin.key"  # the router listens beyond loopback: its admin API needs a key
    key.write_text(ADMIN_KEY + "\n")
    key.chmod(0o600)
    router = Router({"workers": urls + remote_urls, "host": "0.0.0.0", "port": ROUTER_PORT, "metricsHost": "0.0.0.0",
                     "metricsPort": ROUTER_METRICS_PORT, "drainSec": 5, "adminApiKeyFile": str(key)},
                    host_dir / "run").start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        router.wait_healthy(urls, timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        (host_dir / "agent.json").write_text(json.dumps({
            "restart_command": sup.restart_command, "router_settings": str(host_dir / "run" / "router.json"),
            "workers": urls}))
        done.wait()
    finally:
        router.stop()
        sup.shutdown()
        time.sleep(0.2)
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
