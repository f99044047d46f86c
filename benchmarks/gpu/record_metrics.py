"""Record what a real DFLASH instance and the router serve to a monitor: /metrics, /v1/loads, /server_info.

    python3 benchmarks/gpu/record_metrics.py --instance a.json --python STACK/bin/python --out DIR

One instance (its settings should set enableMetrics) under `dflashctl serve` (tests/rollout_harness.py
does systemd's part), the router in front of it as its unit runs it, a few greedy requests
through the router so that every counter has moved, then each endpoint saved as it answered:
DIR/instance-metrics.txt, instance-loads.json, instance-server-info.json, router-metrics.txt,
router-workers.json. The stand-ins of the tests serve these names (never guessed).
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
from rollout_harness import Supervisor  # noqa: E402
from router_harness import ENV, Router, free_port, request  # noqa: E402

from dflashctl.operations import router_unit  # noqa: E402
from dflashctl.service import config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", required=True, metavar="FILE")
    ap.add_argument("--python", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--requests", type=int, default=24)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = config.load(args.instance)
    sup = Supervisor(args.out)
    sup.add(cfg.name, [sys.executable, "-m", "dflashctl", "serve", "--config", args.instance, "--python", args.python],
            dict(ENV, LOGS_DIRECTORY=str(args.out)))
    sup.start_all(timeout=600)
    settings = router_unit.settings_for([cfg], {"port": free_port(), "metricsPort": free_port()})
    settings.pop("instanceUnits")
    router = Router(settings, args.out).start()
    try:
        router.wait_healthy([cfg.base_url], timeout=120)
        body = {"input_ids": list(range(10, 42)), "sampling_params": {"temperature": 0, "max_new_tokens": 64,
                                                                     "ignore_eos": True}}
        answers = [request(router.url + "/generate", "POST", body, timeout=120) for _ in range(args.requests)]
        print(f"{sum(s == 200 for s, _ in answers)} of {len(answers)} answered through the router")
        for name, url in (("instance-metrics.txt", cfg.base_url + "/metrics"),
                          ("instance-loads.json", cfg.base_url + "/v1/loads"),
                          ("instance-server-info.json", cfg.base_url + "/server_info"),
                          ("router-metrics.txt", f"http://127.0.0.1:{settings['metricsPort']}/metrics"),
                          ("router-workers.json", router.url + "/workers")):
            status, data = request(url, timeout=60)
            (args.out / name).write_bytes(data)
            print(f"{name}: HTTP {status}, {len(data)} bytes")
        last = json.loads(answers[-1][1]) if answers[-1][0] == 200 else {}
        print("last answer's meta_info:", json.dumps(last.get("meta_info"), sort_keys=True)[:600])
    finally:
        router.stop()
        sup.shutdown()


if __name__ == "__main__":
    main()
