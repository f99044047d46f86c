"""What serve's GPU watch costs on the decode path: one real SGLang instance, the watch on and off.

    python3 benchmarks/gpu/watch_cost.py --out DIR [--windows 6 --window-s 3 --clients 8 --tokens 256]

One DFLASH instance of the smoke's oracle pair (the settings benchmarks/gpu/rollout.sh runs on the
H200) under the real `dflashctl serve`, with its own watch turned off (DFLASHCTL_GPU_WATCH=0 in its
environment). Closed-loop clients decode greedy /generate requests of --tokens new tokens without
pause; the run is cut into windows, and in half of them (in the order off on on off off on ..., so
a drift in either direction cancels) this script runs the watch exactly as serve does
(host/gpu_watch.GpuWatch: the same child of the stack's Python, blocking on the critical-XID event
set, reading the watch figures once a second). Per window: output tokens/s of the requests that
ended in it. Prints and writes (DIR/watch-cost.json, DIR/watch-cost.txt) tokens/s with and without
the watch, their ratio, the spread of the windows without it (the noise floor), and the CPU time
the watch child used. Standard library and dflashctl only; the stack's Python must import sglang.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "python"))
from dflashctl.host import driver  # noqa: E402
from dflashctl.host.gpu_watch import OFF_ENV, GpuWatch  # noqa: E402
from dflashctl.smoke import loadgen, oracle  # noqa: E402
from dflashctl.smoke.servers import DEFAULT_SYNTHETIC_KV_TOKENS  # noqa: E402

PORT = 31100


def settings(work: Path) -> Path:
    pair = oracle.write_pair(work / "models")
    s = {"name": "watch", "model": str(pair.target), "draftModel": str(pair.draft), "port": PORT,
         "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
         "gpus": [0], "attentionBackend": "triton", "samplingBackend": "pytorch", "skipTokenizerInit": True,
         "grammarBackend": "none", "memFractionStatic": 0.5, "cudaGraphMaxBs": 8, "startTimeoutSec": 600,
         "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)],
         "cacheDir": str(work / "cache"), "environment": {OFF_ENV: "0"}}  # the script runs the watch itself
    path = work / "watch.json"
    path.write_text(json.dumps(s, indent=2))
    return path


def post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base: str, proc: subprocess.Popen, limit: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base + "/health_generate", timeout=30) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"not ready after {limit:.0f} s")


class Load:
    """Closed-loop clients; every answered request as (end time, output tokens)."""

    def __init__(self, base: str, clients: int, tokens: int):
        shape = oracle.OracleShape()
        self.prompts = loadgen.token_prompts(clients, 64, 7, shape.hi)
        self.url, self.tokens, self.done, self.errors = base + "/generate", tokens, [], 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(p,), daemon=True) for p in self.prompts]

    def _client(self, prompt: list[int]) -> None:
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": self.tokens, "temperature": 0,
                                                         "ignore_eos": True}}
        while not self._stop.is_set():
            try:
                n = post(self.url, body)["meta_info"]["completion_tokens"]
            except (OSError, ValueError, KeyError):
                with self._lock:
                    self.errors += 1
                continue
            with self._lock:
                self.done.append((time.monotonic(), n))

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def tokens_between(self, t0: float, t1: float) -> int:
        with self._lock:
            return sum(n for t, n in self.done if t0 <= t < t1)

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=130)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def order(n: int) -> list[bool]:
    """off on on off off on on off ...: each half sees early and late windows alike."""
    return [(i + 1) // 2 % 2 == 1 for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable, help="the stack's interpreter (SGLang)")
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--start-limit", type=float, default=300.0)
    ap.add_argument("--launcher", metavar="CMD", default=os.environ.get("DFLASHCTL_SGLANG_LAUNCHER"),
                    help="to check this script without a GPU: serve's --launcher (a stand-in SGLang), no preflight "
                         "(default $DFLASHCTL_SGLANG_LAUNCHER)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="watch-cost-"))
    cfg = settings(work)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    log = open(out / "watch-cost-serve.log", "w")
    argv = [a.python, "-m", "dflashctl", "serve", "--config", str(cfg), "--python", a.python]
    argv += ["--launcher", a.launcher, "--skip-preflight"] if a.launcher else []
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{PORT}"
    result: dict = {"windows": [], "settings": {k: getattr(a, k) for k in ("windows", "window_s", "warmup_s",
                                                                           "clients", "tokens")}}
    try:
        result["ready_s"] = round(wait_ready(base, proc, a.start_limit), 1)
        watch_env = driver.provide(env)[0]  # NVML where serve's SGLang finds it, as serve hands it the watch
        load = Load(base, a.clients, a.tokens).start()
        time.sleep(a.warmup_s)
        for on in order(a.windows):
            watch, cpu0 = None, 0.0
            if on:
                watch = GpuWatch(a.python, [0], watch_env).start()
                state = watch.wait_started()
                if state != "watching":
                    raise SystemExit(f"the watch did not start: {state}")
                cpu0 = cpu_seconds(watch.pid)  # its start-up (interpreter, nvmlInit, event set) apart
            w0 = time.monotonic()
            time.sleep(a.window_s)
            w1 = time.monotonic()
            row = {"watch": on, "tokens_per_s": round(load.tokens_between(w0, w1) / (w1 - w0), 1)}
            if watch is not None:
                row["watch_start_cpu_s"] = round(cpu0, 3)
                row["watch_cpu_s"] = round(cpu_seconds(watch.pid) - cpu0, 4)
                row["watch_state"] = watch.describe()
                watch.stop()
            result["windows"].append(row)
            print(json.dumps(row), flush=True)
        load.stop()
        result["request_errors"] = load.errors
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    on = [w["tokens_per_s"] for w in result["windows"] if w["watch"]]
    off = [w["tokens_per_s"] for w in result["windows"] if not w["watch"]]
    result.update(on_mean=round(statistics.mean(on), 1), off_mean=round(statistics.mean(off), 1),
                  ratio=round(statistics.mean(on) / statistics.mean(off), 4),
                  off_spread=round((max(off) - min(off)) / statistics.mean(off), 4),
                  watch_cpu_s_per_s=round(statistics.mean(w["watch_cpu_s"] for w in result["windows"] if w["watch"])
                                          / a.window_s, 5),
                  watch_start_cpu_s=round(statistics.mean(w["watch_start_cpu_s"] for w in result["windows"]
                                                          if w["watch"]), 3),
                  total_s=round(time.monotonic() - t0, 1))
    text = (f"ready after {result['ready_s']} s; {a.clients} clients x {a.tokens} tokens, {a.windows} windows of "
            f"{a.window_s:g} s\nwith the watch: {result['on_mean']} tok/s, without: {result['off_mean']} tok/s, "
            f"ratio {result['ratio']} (windows without it spread {result['off_spread']:.1%}); the watch child "
            f"used {result['watch_cpu_s_per_s']} CPU s per s watching ({result['watch_start_cpu_s']} s to start); "
            f"{result['request_errors']} "
            f"request errors; {result['total_s']} s in all\n")
    (out / "watch-cost.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "watch-cost.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
