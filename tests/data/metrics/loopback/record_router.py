"""Record the real sglang-router 0.3.2's /metrics after a worker was killed under load, so the
families that only appear then (smg_worker_retries_total, smg_worker_errors_total, circuit-breaker
transitions) are on file with their labels; the H200 recording (../h200/router-metrics.txt) saw no
retry. Two stand-in workers, four clients (two streaming), the second worker killed after 2 s, the
scrape 6 s later. Run from tests/ with the venv that has sglang-router:

    ../.venv/bin/python data/metrics/loopback/record_router.py data/metrics/loopback/router-after-kill-metrics.txt
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/
from router_harness import Load, Router, Standin, free_port, generate_body, request  # noqa: E402

tmp = Path(tempfile.mkdtemp())
workers = [Standin(free_port(55535), tmp).start() for _ in range(2)]
router = Router({"workers": [w.url for w in workers]}, tmp).start()
router.wait_healthy([w.url for w in workers])
loads = [Load(router.url + "/generate", generate_body(8, stream=s), clients=2, max_requests=10 ** 6,
              seconds=60).start() for s in (False, True)]
time.sleep(2)
workers[1].kill9()
time.sleep(6)
for load in loads:
    load.stop()
status, body = request(f"http://127.0.0.1:{router.settings['metricsPort']}/metrics")
assert status == 200, status
Path(sys.argv[1]).write_bytes(body)
router.stop()
workers[0].stop()
