"""Real SGLang 0.5.11 with an API key, and `dflashctl status` over it with the key readable, unreadable
and wrong (issue 42: "answers but this user may not read it" is named, not failed).

    python3 benchmarks/gpu/status_auth.py --work DIR --python STACK/bin/python --out OUT [--budget 110]
        [--serve-arg ARG ...]

One instance of the smoke's oracle pair (DFLASH) under `dflashctl serve` (tests/rollout_harness.py
does systemd's part) with `apiKeyFile`. Once it is ready: what SGLang answers without the key on
/health, /health_generate, /metrics, /model_info, /v1/loads and /server_info (the behaviour the
stand-in SGLang copies from SGLang's auth middleware), then `dflashctl status --json --no-router`
over three settings files of the same instance differing only in apiKeyFile: the real key file,
one that cannot be read (a path that is not there; and, where setpriv is here, the key file in a
directory of another user read as root without DAC override), one holding another key. Expected:
401 on /model_info, /v1/loads and /server_info, 200 on /health and /metrics; status exit 0 with
http_status 200, then exit 0 with http_status 401 and the key named under missing, then exit 1
with "refuses the key in its apiKeyFile". Writes OUT/status-auth.json; prints each verdict.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
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
from router_harness import ENV  # noqa: E402

from dflashctl.smoke import oracle  # noqa: E402
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS  # noqa: E402

T0 = time.monotonic()
PORT = 31020
KEY = "sk-status-auth-" + os.urandom(6).hex()
PATHS = ["/health", "/health_generate", "/metrics", "/model_info", "/v1/loads?include=core", "/server_info"]


def settings(pair, key_file: str, cache: Path) -> dict:
    return {"name": "auth", "model": str(pair.target), "draftModel": str(pair.draft), "port": PORT,
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
            "gpus": [0], "attentionBackend": "triton", "samplingBackend": "pytorch", "skipTokenizerInit": True,
            "grammarBackend": "none", "memFractionStatic": 0.25, "cudaGraphMaxBs": 8, "apiKeyFile": key_file,
            "startTimeoutSec": 600, "cacheDir": str(cache),
            "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)]}


def status_of(path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    except OSError:
        return 0
    finally:
        conn.close()


def run_status(work: Path, name: str, key_file: str, pair, wrap: list[str]) -> dict:
    f = work / f"status-{name}.json"
    f.write_text(json.dumps(settings(pair, key_file, work / "cache")))
    argv = [*wrap, sys.executable, "-m", "dflashctl", "status", "--json", "--no-router", "--window", "0",
            "--state-dir", str(work / "no-rollout"), "--instance", str(f)]
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    try:
        row = json.loads(done.stdout)["instances"][0]
    except (ValueError, KeyError, IndexError):
        return {"exit": done.returncode, "stderr": done.stderr[-800:]}
    out = {"exit": done.returncode, **{k: row[k] for k in ("answers", "http_status", "metrics", "problems")},
           "missing_key": [m for m in row["missing"] if m.startswith("API key")]}
    print(f"status, key {name}: {json.dumps(out)}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=110.0)
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pair = oracle.write_pair(args.work / "models")
    key = args.work / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    serving = args.work / "auth.json"
    serving.write_text(json.dumps(settings(pair, str(key), args.work / "cache"), indent=2))
    sup = Supervisor(args.work)
    sup.add("auth", [sys.executable, "-m", "dflashctl", "serve", "--config", str(serving), "--python", args.python,
                     *args.serve_arg], dict(ENV, LOGS_DIRECTORY=str(args.work)))
    result = {"key_len": len(KEY)}
    try:
        sup.start_all(timeout=max(30.0, args.budget - (time.monotonic() - T0) - 20))
        result["ready_s"] = round(time.monotonic() - T0, 1)
        result["without_key"] = {p: status_of(p) for p in PATHS}
        print(f"ready after {result['ready_s']} s; without the key: {json.dumps(result['without_key'])}", flush=True)
        (args.work / "wrong").write_text("not-the-key\n")
        result["status"] = {"readable": run_status(args.work, "readable", str(key), pair, []),
                            "missing": run_status(args.work, "missing", str(args.work / "no-such-key"), pair, []),
                            "wrong": run_status(args.work, "wrong", str(args.work / "wrong"), pair, [])}
        if os.geteuid() == 0 and shutil.which("setpriv"):  # permission denied as it is for a user, not root
            locked = args.work / "locked"
            locked.mkdir(mode=0o700)
            shutil.copy(key, locked / "key")
            os.chown(locked, 65534, 65534)
            drop = "-dac_override,-dac_read_search"
            result["status"]["denied"] = run_status(args.work, "denied", str(locked / "key"), pair,
                                                    ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--"])
    finally:
        sup.shutdown()
        (args.out / "status-auth.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"total {time.monotonic() - T0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
