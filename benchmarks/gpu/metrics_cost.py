"""What SGLang's metrics (`enableMetrics`, `--enable-metrics`) cost a DFLASH instance's decoding, and
`dflashctl status` over real instances and the router.

    python3 benchmarks/gpu/metrics_cost.py --work DIR --python STACK/bin/python --out OUT [--budget 110]
        [--round 2.5] [--no-router]

Two instances of the smoke's oracle pair (DFLASH, block 16) on the one GPU, identical but for
`enableMetrics` (`on`, `off`), both under `dflashctl serve` (tests/rollout_harness.py does systemd's
part), started together so one start-up is paid. Then, alternately and never both loaded at once,
rounds of greedy requests of fixed token ids (ignore_eos, 256 new tokens) at 1 and at 8 concurrent
clients: output tokens/s per round, the median per mode. Then `dflashctl status --json` (and its
table) over the two instances, with the router in front of both unless --no-router (sglang-router
is a separate payload; without it status names the router as not configured). Writes
OUT/metrics-cost.json and OUT/status-h200.json / .txt; prints a table. Each measurement stops when
--budget seconds (from the start of this script) would be exceeded, saying so.
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "python")]
try:
    import pytest  # noqa: F401 - router_harness marks its tests with it
except ImportError:  # a device image without pytest: the marks are all router_harness asks of it
    import types
    sys.modules["pytest"] = types.SimpleNamespace(mark=types.SimpleNamespace(skipif=lambda *a, **k: None))
from rollout_harness import Supervisor  # noqa: E402
from router_harness import ENV, Router, free_port  # noqa: E402

from dflashctl.operations import router_unit  # noqa: E402
from dflashctl.service import config  # noqa: E402
from dflashctl.smoke import oracle  # noqa: E402
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS  # noqa: E402

T0 = time.monotonic()
PORTS = {"on": 31010, "off": 31011}
NEW_TOKENS = 256


def settings(name: str, metrics: bool, pair, cache: Path) -> dict:
    return {"name": name, "model": str(pair.target), "draftModel": str(pair.draft), "port": PORTS[name],
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
            "gpus": [0], "allowSharedGpus": True, "attentionBackend": "triton", "samplingBackend": "pytorch",
            "skipTokenizerInit": True, "grammarBackend": "none", "memFractionStatic": 0.25, "cudaGraphMaxBs": 8,
            "enableMetrics": metrics, "startTimeoutSec": 600, "cacheDir": str(cache),
            "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)]}


def one(port: int, prompt: list[int]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
    conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data}")
    return int(data["meta_info"]["completion_tokens"])


def round_of(port: int, clients: int, seconds: float) -> dict:
    """`clients` closed-loop clients for `seconds`: output tokens per second over the round."""
    tokens, lock, stop = [0], threading.Lock(), time.monotonic() + seconds

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            n = one(port, [10 + (k * 7 + i) % 900 for _ in range(16)])
            with lock:
                tokens[0] += n
            i += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"tokens": tokens[0], "seconds": round(wall, 2), "tokens_per_s": round(tokens[0] / wall, 1)}


def start_router(files: dict, args) -> tuple[Router | None, str]:
    """sglang-router in front of both instances, a few requests through it: (the Router, "ready"),
    or (None, why not), so status still runs over the instances."""
    cfgs = [config.load(f) for f in files.values()]
    rsettings = router_unit.settings_for(cfgs, {"port": free_port(), "metricsPort": free_port()})
    rsettings.pop("instanceUnits")
    router = Router(rsettings, args.work)
    try:
        router.start()
        router.wait_healthy([c.base_url for c in cfgs], timeout=max(10.0, left(args.budget) - 8))
        for _ in range(4):
            one(rsettings["port"], list(range(10, 26)))
    except (RuntimeError, OSError, AssertionError) as e:
        router.stop()
        print(f"router did not start: {str(e)[-600:]}", flush=True)
        return None, f"did not start: {str(e)[-300:]}"
    return router, "ready"


def keep_busy(port: int, until: list[float]) -> None:
    """One closed-loop client until `until[0]` (monotonic) passes; errors end it quietly."""
    i = 0
    while time.monotonic() < until[0]:
        try:
            one(port, [10 + (i * 7) % 900 for _ in range(16)])
        except (OSError, RuntimeError, ValueError):
            return
        i += 1


def left(budget: float) -> float:
    return budget - (time.monotonic() - T0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=110.0, help="seconds for all of it (110)")
    ap.add_argument("--round", type=float, default=2.5, help="seconds per round (2.5)")
    ap.add_argument("--no-router", action="store_true", help="status over the instances alone (no sglang-router here)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="passed on to `dflashctl serve` (a dry run without a GPU: --skip-preflight, "
                         "--launcher 'python3 tests/data/service/standin_server.py')")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pair = oracle.write_pair(args.work / "models")
    files = {}
    for name in PORTS:
        files[name] = args.work / f"{name}.json"
        files[name].write_text(json.dumps(settings(name, name == "on", pair, args.work / "cache"), indent=2))
    sup = Supervisor(args.work)
    for name, f in files.items():
        sup.add(name, [sys.executable, "-m", "dflashctl", "serve", "--config", str(f), "--python", args.python,
                       *args.serve_arg],
                dict(ENV, LOGS_DIRECTORY=str(args.work)))
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        gpu = f"nvidia-smi: {e}"
    result = {"gpu": gpu,
              "new_tokens": NEW_TOKENS, "round_s": args.round, "rounds": {"on": {}, "off": {}}}
    router = None
    try:
        t = time.monotonic()
        sup.start_all(timeout=max(30.0, left(args.budget) - 20))
        result["start_s"] = round(time.monotonic() - t, 1)
        print(f"both instances ready after {result['start_s']} s ({left(args.budget):.0f} s of the budget left)",
              flush=True)
        for name in PORTS:  # one warm-up request each (first-request allocations, CUDA graphs' first replay)
            one(PORTS[name], list(range(10, 26)))
        order = ["off", "on", "on", "off", "off", "on"]  # ABBA: drift and warming fall on both alike
        reserve = 8 if args.no_router else 15  # status (and the router's start) after the rounds
        for clients in (1, 8):
            for name in order:
                if left(args.budget) < args.round + reserve:
                    result["cut_short"] = f"budget reached at {clients} client(s)"
                    print(f"rounds cut short: {result['cut_short']}", flush=True)
                    break
                r = round_of(PORTS[name], clients, args.round)
                result["rounds"][name].setdefault(str(clients), []).append(r)
                print(f"metrics {name:3}  clients {clients}  {r['tokens_per_s']:8.1f} tok/s", flush=True)
        summary = {}
        for clients in ("1", "8"):
            on = [r["tokens_per_s"] for r in result["rounds"]["on"].get(clients, [])]
            off = [r["tokens_per_s"] for r in result["rounds"]["off"].get(clients, [])]
            if on and off:
                m_on, m_off = statistics.median(on), statistics.median(off)
                summary[clients] = {"on": m_on, "off": m_off, "cost_percent": round(100 * (m_off - m_on) / m_off, 2)}
        result["median_tokens_per_s"] = summary
        # dflashctl status over both instances and, where sglang-router is here, the router in front
        argv = [sys.executable, "-m", "dflashctl", "status", "--instance", str(files["on"]),
                "--instance", str(files["off"])]
        router, result["router"] = (None, "--no-router") if args.no_router else start_router(files, args)
        argv += ["--router", str(args.work / "router.json")] if router else ["--no-router"]
        # under load (two clients per instance, through the router where it runs), so the rows show
        # tokens/s and acceptance while decoding rather than idle
        busy_until = [time.monotonic() + 600]
        ports = [router.settings["port"] if router else PORTS[name] for name in PORTS for _ in range(2)]
        load = [threading.Thread(target=keep_busy, args=(port, busy_until), daemon=True) for port in ports]
        for t in load:
            t.start()
        time.sleep(1)
        for suffix, extra in (("json", ["--json"]), ("txt", [])):
            done = subprocess.run(argv + extra, capture_output=True, text=True, env=ENV, timeout=60)
            text = done.stdout if suffix == "json" else f"{done.stdout}{done.stderr}# exit {done.returncode}\n"
            (args.out / f"status-h200.{suffix}").write_text(text)
            result[f"status_exit_{suffix}"] = done.returncode
        busy_until[0] = 0
        for t in load:
            t.join(timeout=30)
        print(f"status --json: exit {result['status_exit_json']}", flush=True)
        print((args.out / "status-h200.txt").read_text(), flush=True)
    finally:
        if router is not None:
            router.stop()
        sup.shutdown()
        (args.out / "metrics-cost.json").write_text(json.dumps(result, indent=2) + "\n")
    for clients, s in result.get("median_tokens_per_s", {}).items():
        print(f"{clients} client(s): median {s['off']} tok/s without metrics, {s['on']} with: "
              f"{abs(s['cost_percent'])} % {'slower' if s['cost_percent'] >= 0 else 'faster'} with them", flush=True)
    print(f"total {time.monotonic() - T0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
