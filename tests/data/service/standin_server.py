"""A stand-in for `python -m sglang.launch_server`: a real HTTP server process for supervisor tests.

Parses its argv as SGLang 0.5.11 does (tests/data/sglang/strict_args.py, found beside this file or
in ../sglang; STANDIN_DDTREE=1 adds the DDTree patch's flag and choice): a flag or choice SGLang
0.5.11 does not have exits 2 with argparse's message, as there. Copied alone (the NixOS VM test)
it says on its first line that it checks no flags. It uses --port, --host, --model-path,
--served-model-name, the speculative flags and the load formats, and behaves as STANDIN_MODE says:
  healthy          /health_generate answers 503 for STANDIN_READY_AFTER seconds, then 200
  crash            logs a few lines, then exits 3 after STANDIN_READY_AFTER seconds (never ready)
  hang             listens, but /health_generate never answers 200
  die-after-ready  like healthy, then exits 4 STANDIN_DIE_AFTER seconds after the first 200 (of
                   /health_generate or a plain /generate)
  silent           never listens at all
  stall            listens (503 to every health poll, logged as SGLang's access log would), logs a
                   loading line every STANDIN_PROGRESS_EVERY seconds for STANDIN_STALL_AFTER seconds,
                   then "Capturing CUDA graphs", then nothing more
STANDIN_LISTEN_AFTER seconds pass before it listens at all (SGLang's imports and model load).
Once ready it logs SGLang's "The server is fired up and ready to roll!" line (healthy and
die-after-ready modes; an INFO line, so not with --log-level warning or above); /health_generate then answers 200 after STANDIN_HEALTH_SECONDS (default 0;
SGLang 0.5.11's handler sleeps 1 s first). It writes its argv as JSON to STANDIN_ARGV_FILE, appends
a line to STANDIN_OK_FILE before each 200 of /health_generate or of a plain (not streamed) /generate,
and exits 0 on SIGTERM. A /generate with "log_metrics": false stays out of /metrics, as in SGLang. /server_info's `version` is STANDIN_VERSION (default 0.5.11: a build's
stand-in sets its own). For the systemd tier (tests/service/test_systemd.py), also:
  STANDIN_CHILDREN=N  start N helper processes in its process group that ignore SIGTERM (SGLang's
                      scheduler and detokenizer stay in the group; a stuck one must still go)
  STANDIN_MARK=1      append "pid uid" to standin-starts in $HOME and in $HF_HOME, and in each
                      JIT cache directory dflashctl names (TVM_FFI_CACHE_DIR, CUTE_DSL_CACHE_DIR, ...)
  STANDIN_JIT=1       first compile and run, with `c++` from PATH in $HOME/jit, a program that
                      dlopens a shared library, as SGLang's first start does (exit 5 if that fails)
Its processes start as SGLang 0.5.11's do (srt/entrypoints/engine.py): after its own imports it sets
multiprocessing's `spawn` start method and starts a scheduler (which reports ready through a pipe)
and a detokenizer with `mp.Process`, waits for the scheduler, then listens (what the mode does, a
crash or a stall, runs from the server's start, beside its children's start). Each of the three
imports standin_heavy.py (beside this file; skipped where it is not), which appends its pid to
STANDIN_IMPORT_LOG. The children set PR_SET_PDEATHSIG against their parent and, on an exception,
send their parent (psutil's `parent()` in SGLang) SIGQUIT; the server then kills its process tree
and dies of SIGQUIT, as SGLang's launch-phase handler does; a watchdog thread sees a child that
died without a word within a second (SGLang's SubprocessWatchdog). For tests:
  STANDIN_SGLANG_CHILDREN=0        no children (the server alone)
  STANDIN_SCHEDULER_FAIL_AFTER=S   the scheduler raises S seconds after it reported ready
  STANDIN_CHILD_PIDFILE=F          the server writes {"scheduler": pid, "detokenizer": pid} to F
Once ready (healthy and die-after-ready modes) it also serves what a router asks of a worker, in
SGLang 0.5.11's JSON shapes: GET /health, /v1/models, /model_info, /server_info; POST /generate and
/v1/chat/completions, each as JSON or as a server-sent event stream ("stream": true). Every answer
names the port that served it (`meta_info.id` / `id` start with "standin-<port>-"), so a test can
count where a router sent each request. STANDIN_TOKEN_DELAY seconds pass per generated token
(default 0), and STANDIN_STEP_DELAY seconds per forward pass (default 0: the prefill's, then one per
decode step, or per verify step under --speculative-algorithm): a slower build is a definition with a
larger one (slower kernels make every pass slower). Greedy output ids follow the prompt (the same
prompt, the same ids: a rollout's canary compares them), from token STANDIN_DIVERGE_FROM on shifted
by one (a build that decodes differently).
When --model-path is a directory with a config.json (the smoke's oracle pair, smoke/oracle.py), the
models are decoded from their files as the smoke's stand-in SGLang decodes them
(../smoke/fake_sglang/sglang/standin_model.py): the target's greedy rule, and under
--speculative-algorithm DFLASH's verify loop with the drafter --speculative-draft-model-path names,
so the smoke's broken drafter (`--pair broken`) accepts about one token per step, as on the H200,
while the outputs stay the same (DFLASH is lossless). Its prompts must be token ids the pair's rule
can continue (at least 15 of [10, 1000)); others get a 400, as from the smoke's stand-in.
A speculative /generate streams one chunk per verify step and ends with 0.5.11's counters in its last
`meta_info` (spec_accept_length = completion_tokens / spec_verify_ct, spec_verify_ct,
spec_accepted_drafts, spec_proposed_drafts, spec_accept_rate); without a pair the verify steps
commit the acceptance length below.
GET /v1/loads answers as SGLang 0.5.11 does, with the requests this process is answering. With
--enable-metrics, GET /metrics serves SGLang 0.5.11's families from a recording, moving with this
process's requests (standin_metrics.py); with --speculative-algorithm the acceptance length is 15.75
(the recording's), or the number in the file STANDIN_ACCEPT_LENGTH_FILE, read at each scrape and at
each request (a test lowers it there; a definition naming another file is a build that accepts
less), or with a pair what it served; /v1/loads and /server_info report it too. /server_info holds
every ServerArgs field as parsed (model, revision, drafter, backends), as 0.5.11's does. Bad requests
get SGLang's answers: 400 for JSON that does not parse, for empty `input_ids`, or for more than
STANDIN_CONTEXT (default 4096) input tokens. With --api-key KEY (or STANDIN_API_KEY), as SGLang
0.5.11's auth middleware (srt/utils/auth.py): every route but /health* and /metrics answers 401
{"error": "Unauthorized"} unless `Authorization: Bearer KEY`.
"""

import http.server
import importlib.util
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def sglang_flags_checked():
    """(strict_args, the namespace SGLang 0.5.11's parser gives argv) where their facts are at hand,
    else (None, None); exit 2 on a refusal."""
    for d in (HERE, os.path.join(os.path.dirname(HERE), "sglang")):
        if os.path.exists(os.path.join(d, "strict_args.py")):
            sys.path.insert(0, d)
            import strict_args
            return strict_args, strict_args.parse(sys.argv[1:], ddtree=os.environ.get("STANDIN_DDTREE") == "1")
    return None, None


strict_args, parsed = sglang_flags_checked()
checked = parsed is not None
mode = os.environ.get("STANDIN_MODE", "healthy")
ready_after = float(os.environ.get("STANDIN_READY_AFTER", "0.5"))
die_after = float(os.environ.get("STANDIN_DIE_AFTER", "0.3"))
args = sys.argv[1:]
port = int(args[args.index("--port") + 1]) if "--port" in args else 30000
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
started = time.monotonic()
served_ok = threading.Event()
health_seconds = float(os.environ.get("STANDIN_HEALTH_SECONDS", "0"))

JIT_CACHES = ("TVM_FFI_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR",
              "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR")  # what dflashctl names (host/jit_caches.py)
IS_SERVER = __name__ == "__main__"  # a spawned child runs this file again first, as __mp_main__
if IS_SERVER and os.environ.get("STANDIN_ARGV_FILE"):
    with open(os.environ["STANDIN_ARGV_FILE"], "w") as f:
        json.dump({"argv": sys.argv, "env": {k: v for k, v in os.environ.items()
                                             if k in ("CUDA_VISIBLE_DEVICES", "HF_HOME", "FOO", "HF_TOKEN",
                                                      "HF_HUB_OFFLINE", *JIT_CACHES)}}, f)


def on_term(signum, frame):
    print(f"standin: got signal {signum}, shutting down", flush=True)
    # Its scheduler and detokenizer go first: a child still importing has not yet asked for
    # PR_SET_PDEATHSIG and would outlive the server (and keep multiprocessing's resource tracker up).
    for child in mp.active_children():
        child.kill()
    os._exit(0)


if IS_SERVER:
    signal.signal(signal.SIGTERM, on_term)
    if not checked:
        print("standin: SGLang's flags not checked (no strict_args.py beside this file or in ../sglang)", flush=True)
    print(f"standin: mode={mode} port={port}", flush=True)
    print("standin: Loading safetensors checkpoint shards", flush=True)


MODEL = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--served-model-name"),
             next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model-path"), "standin-model"))
token_delay = float(os.environ.get("STANDIN_TOKEN_DELAY", "0"))
step_delay = float(os.environ.get("STANDIN_STEP_DELAY", "0"))
context = int(os.environ.get("STANDIN_CONTEXT", "4096"))
counter = iter(range(1, 1 << 62))
diverge_from = int(os.environ.get("STANDIN_DIVERGE_FROM", "-1"))
API_KEY = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--api-key"), None) \
    or os.environ.get("STANDIN_API_KEY")
ALGORITHM = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--speculative-algorithm"), None)
BLOCK = int(next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--speculative-num-draft-tokens"), "16"))


def flag(name: str, default: str | None = None) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == name), default)


def load_pair():
    """The models --model-path and --speculative-draft-model-path name, read by the smoke's stand-in
    SGLang's own reader (standin_model.py), when --model-path is a directory with a config.json and
    that reader is at hand; None otherwise (the ids rule of output_ids below)."""
    path = flag("--model-path")
    reader = os.path.join(os.path.dirname(HERE), "smoke", "fake_sglang", "sglang", "standin_model.py")
    if not path or not os.path.isfile(os.path.join(path, "config.json")) or not os.path.isfile(reader):
        return None
    spec = importlib.util.spec_from_file_location("standin_model", reader)
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    target, eos = model.load_target(path, flag("--load-format") == "dummy")
    drafter, block = None, 1
    if ALGORITHM is not None:
        draft = flag("--speculative-draft-model-path", "")
        drafter = model.load_drafter(draft, flag("--speculative-draft-load-format") == "dummy", target)
        given = flag("--speculative-num-draft-tokens") or flag("--speculative-dflash-block-size")
        block = model.block_size(draft, int(given) if given else None)
    print(f"standin: decoding {type(target).__name__} / {type(drafter).__name__ if drafter else None} "
          f"from {path}, block {block}", flush=True)
    return model, target, drafter, block, eos


served = {"tokens": 0, "verify": 0}  # what this process decoded speculatively (the pair's acceptance)
served_lock = threading.Lock()


def accept_length() -> float | None:
    """The number in STANDIN_ACCEPT_LENGTH_FILE (a test lowers it there), else with a pair what it
    served, else the recording's 15.75 (the oracle drafter, block 16); None without
    --speculative-algorithm."""
    if ALGORITHM is None:
        return None
    try:
        return float(open(os.environ["STANDIN_ACCEPT_LENGTH_FILE"]).read().strip())
    except (KeyError, OSError, ValueError):
        pass
    with served_lock:
        if PAIR is not None and served["verify"]:
            return served["tokens"] / served["verify"]
    return 15.75


PAIR = load_pair()


if "--enable-metrics" in args:  # only then: standin_metrics.py and its recording are beside this file
    import standin_metrics
    metrics = standin_metrics.Registry(MODEL, ALGORITHM is not None, BLOCK, accept_length)
else:
    metrics = None
in_flight = 0
in_flight_lock = threading.Lock()


def output_ids(prompt: list, n: int) -> list[int]:
    """Greedy ids: a function of the prompt and the position (every vocabulary has ids below 1000)."""
    seed = sum((i + 1) * int(t) for i, t in enumerate(prompt)) if isinstance(prompt, list) else len(prompt)
    ids = [(seed * 31 + k * 7) % 990 + 10 for k in range(n)]
    return [t + 1 if 0 <= diverge_from <= k else t for k, t in enumerate(ids)]


class Undecodable(Exception):
    """A prompt the pair's rule cannot continue (SGLang would decode something; the rule cannot)."""


def decode(prompt, n: int) -> dict:
    """{"ids", "commits" (tokens each forward pass adds: the prefill's, then each step's), "verify",
    "accepted", "proposed"} of one greedy request of n tokens."""
    if PAIR is not None and isinstance(prompt, list):
        model, target, drafter, block, eos = PAIR
        s = model.Sampling(max_new_tokens=n, temperature=0, ignore_eos=True)
        try:
            d = model.decode(target, drafter, block, [int(t) for t in prompt], s, eos,
                             {diverge_from: 1} if diverge_from >= 0 else None)
        except ValueError as e:
            raise Undecodable(str(e)) from None
        out = {"ids": d.ids, "commits": d.commits, "verify": d.verify_ct, "accepted": d.accepted,
               "proposed": d.proposed}
    else:
        ids = output_ids(prompt, n)
        out = {"ids": ids, "commits": [1] * n, "verify": 0, "accepted": 0, "proposed": 0}
        if ALGORITHM is not None and n > 1:  # the prefill's token, then steps of the acceptance length
            steps = max(1, min(n - 1, math.ceil((n - 1) / max(accept_length(), 1.0))))
            out["commits"] = [1] + [(n - 1) // steps + (k < (n - 1) % steps) for k in range(steps)]
            out.update(verify=steps, accepted=n - 1 - steps, proposed=steps * (BLOCK - 1))
    if out["verify"]:
        with served_lock:
            served["tokens"] += len(out["ids"])
            served["verify"] += out["verify"]
    return out


def spec_meta(d: dict) -> dict:
    """0.5.11's speculative counters, on a request's last meta_info (absent when nothing was verified)."""
    if not d["verify"]:
        return {}
    return {"spec_accept_rate": d["accepted"] / d["proposed"] if d["proposed"] else 0.0,
            "spec_accept_length": len(d["ids"]) / d["verify"], "spec_accepted_drafts": d["accepted"],
            "spec_proposed_drafts": d["proposed"], "spec_verify_ct": d["verify"]}


def loads() -> dict:
    """/v1/loads in SGLang 0.5.11's shape (entrypoints/v1_loads.py), one DP rank."""
    with in_flight_lock:
        running = in_flight
    rank = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0, "num_used_tokens": 0,
            "num_total_tokens": 0, "max_total_num_tokens": 4096, "token_usage": 0.0, "gen_throughput": 0.0,
            "cache_hit_rate": 0.0, "utilization": 0.0, "max_running_requests": 48, "num_total_reqs": running}
    if ALGORITHM is not None:
        rank["speculative"] = {"accept_length": accept_length(), "accept_rate": 0.0}
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "version": "0.5.11",
            "dp_rank_count": 1, "loads": [rank],
            "aggregate": {"total_running_reqs": running, "total_waiting_reqs": 0, "total_reqs": running,
                          "total_used_tokens": 0, "total_tokens": 0, "avg_token_usage": 0.0,
                          "avg_throughput": 0.0, "avg_utilization": 0.0}}


class Handler(http.server.BaseHTTPRequestHandler):
    def ready(self) -> bool:
        return time.monotonic() - started >= ready_after and mode in ("healthy", "die-after-ready")

    def send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def worker_get(self) -> bool:
        """The GET routes a router polls; False when the path is not one of them."""
        if self.path == "/health":
            self.send_response(200 if self.ready() else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                 "root": MODEL, "max_model_len": context}]})
        elif self.path in ("/model_info", "/get_model_info"):
            self.send_json(200, {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
                                 "preferred_sampling_params": None, "weight_version": "default"})
        elif self.path.split("?")[0] == "/v1/loads":
            self.send_json(200, loads())
        elif self.path in ("/server_info", "/get_server_info"):
            fields = strict_args.server_info_fields(parsed) if checked else {}
            self.send_json(200, {**fields, "model_path": flag("--model-path", MODEL), "served_model_name": MODEL,
                                 "port": port, "host": host, "tp_size": fields.get("tp_size", 1),
                                 "dp_size": fields.get("dp_size", 1), "version": os.environ.get("STANDIN_VERSION", "0.5.11"),
                                 "speculative_algorithm": ALGORITHM, "status": "ready",
                                 "internal_states": [{"avg_spec_accept_length": accept_length()}]})
        else:
            return False
        return True

    def refused(self) -> bool:
        """SGLang's middleware runs before any route: with a key, only /health* and /metrics are open;
        the scheme is matched without case, the key exactly."""
        if not API_KEY or self.path.startswith(("/health", "/metrics")):
            return False
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and given == API_KEY:
            return False
        self.send_json(401, {"error": "Unauthorized"})
        return True

    def do_POST(self):
        if self.refused():
            return
        if not self.ready() or self.path not in ("/generate", "/v1/chat/completions"):
            self.send_json(404 if self.ready() else 503, {"error": {"message": f"no route {self.path}"}})
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as e:
            self.send_json(400, {"error": {"message": f"JSON decode error: {e}", "code": 400}})
            return
        if self.path == "/generate":
            ids = body.get("input_ids")
            n_in = len(ids) if isinstance(ids, list) else len(str(body.get("text", "")).split())
            if isinstance(ids, list) and not ids:
                self.send_json(400, {"error": {"message": "input_ids is empty", "code": 400}})
                return
            n_out = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
        else:
            n_in = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
            n_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if n_in > context:
            self.send_json(400, {"error": {"message": f"The input ({n_in} tokens) is longer than the "
                                           f"model's context length ({context} tokens).", "code": 400}})
            return
        global in_flight
        with in_flight_lock:
            in_flight += 1
        counted = metrics is not None and body.get("log_metrics") is not False  # GenerateReqInput's
        if counted:
            metrics.started(n_in)
        t0 = time.monotonic()
        try:
            self.answer(self.path, body, f"standin-{port}-{next(counter)}", n_in, max(n_out, 0))
        finally:
            with in_flight_lock:
                in_flight -= 1
            if counted:
                metrics.finished(n_in, max(n_out, 0), time.monotonic() - t0, bool(body.get("stream")))

    def answer(self, path: str, body: dict, rid: str, n_in: int, n_out: int) -> None:
        t0 = time.monotonic()
        chat = path == "/v1/chat/completions"
        if not chat:
            try:
                d = decode(body.get("input_ids") or body.get("text") or [], n_out)
            except Undecodable as e:
                self.send_json(400, {"error": {"message": str(e), "code": 400}})
                return
            if body.get("stream"):
                self.stream_steps(d, rid, n_in, t0)
                return
            time.sleep(step_delay * len(d["commits"]) + token_delay * n_out)
            self.note_ok()  # serve's readiness decode is one of these
            self.send_json(200, self.generated(d, len(d["ids"]), rid, n_in, t0, True))
            return
        ids = output_ids(body.get("input_ids") or body.get("text") or [], n_out)

        def piece(i: int, last: bool) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": MODEL, "choices": [{"index": 0, "delta": {"content": f" t{i}"},
                                                 "finish_reason": "length" if last else None}]}

        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            last = t0
            for i in range(n_out):
                time.sleep(step_delay + token_delay)
                self.wfile.write(b"data: " + json.dumps(piece(i, i == n_out - 1)).encode() + b"\n\n")
                self.wfile.flush()
                now = time.monotonic()
                if metrics is not None:
                    if i == 0:
                        metrics.first_token(now - t0)
                    metrics.token(None if i == 0 else now - last)
                last = now
            self.wfile.write(b"data: [DONE]\n\n")
            return
        time.sleep((step_delay + token_delay) * n_out)
        text = "".join(f" t{i}" for i in range(n_out))
        self.send_json(200, {"id": rid, "object": "chat.completion", "created": int(time.time()),
                             "model": MODEL, "choices": [{"index": 0, "finish_reason": "length",
                                                          "message": {"role": "assistant", "content": text}}],
                             "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                       "total_tokens": n_in + n_out}})

    def generated(self, d: dict, upto: int, rid: str, n_in: int, t0: float, last: bool) -> dict:
        """A /generate answer (or streamed chunk) holding the first `upto` ids, in 0.5.11's shape."""
        n = len(d["ids"])
        meta = {"id": rid, "finish_reason": {"type": "length", "length": n} if last else None,
                "prompt_tokens": n_in, "weight_version": "default", "total_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": upto, "cached_tokens": 0,
                "cached_tokens_details": {"device": 0, "host": 0}, "dp_rank": None,
                "e2e_latency": time.monotonic() - t0}
        if last:
            meta.update(spec_meta(d))
        return {"text": "".join(f" t{j}" for j in range(upto)), "output_ids": d["ids"][:upto], "meta_info": meta}

    def stream_steps(self, d: dict, rid: str, n_in: int, t0: float) -> None:
        """Server-sent events, one per forward pass (the prefill's token, then each decode or verify
        step's), cumulative ids as SGLang 0.5.11 streams them by default, then [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        last, upto = t0, 0
        for i, c in enumerate(d["commits"]):
            time.sleep(step_delay + token_delay * c)
            upto += c
            chunk = self.generated(d, upto, rid, n_in, t0, i == len(d["commits"]) - 1)
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            now = time.monotonic()
            if metrics is not None:
                if i == 0:
                    metrics.first_token(now - t0)
                metrics.token(None if i == 0 else now - last)
            last = now
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self):
        if self.refused():
            return
        ready = time.monotonic() - started >= ready_after
        if self.path == "/metrics":  # SGLang mounts it at start, before it is ready
            data = metrics.render().encode() if metrics is not None else b"Not Found"
            self.send_response(200 if metrics is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if self.path != "/health_generate" and self.ready() and self.worker_get():
            return
        if self.path == "/health_generate" and ready and mode in ("healthy", "die-after-ready"):
            time.sleep(health_seconds)  # SGLang's handler sleeps before it looks for its token
            self.note_ok()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"")
        else:
            self.send_response(503)
            self.end_headers()

    def note_ok(self) -> None:
        """A 200 that proves decoding is about to leave (/health_generate, a plain /generate)."""
        if os.environ.get("STANDIN_OK_FILE"):  # written before the 200 leaves: tests order on it
            with open(os.environ["STANDIN_OK_FILE"], "a") as f:
                f.write(f"200 {self.path} auth={self.headers.get('Authorization')}\n")
        served_ok.set()

    def log_message(self, fmt, *a):
        print("standin: " + fmt % a, flush=True)


def exit_now(code: int) -> None:
    if os.environ.get("STANDIN_DEATH_FILE"):  # the benchmark times supervisor exit from here
        with open(os.environ["STANDIN_DEATH_FILE"], "w") as f:
            f.write(repr(time.time()))
    os._exit(code)


def crash_later():
    time.sleep(ready_after)
    print("standin: ImportError: cannot import name 'StructuralTag' from 'xgrammar'", flush=True)
    exit_now(3)


def die_after_ready():
    served_ok.wait()
    time.sleep(die_after)
    print("standin: CUDA error: an illegal memory access was encountered", flush=True)
    exit_now(4)


JIT_LIB = 'extern "C" int answer() { return 42; }\n'
JIT_MAIN = r"""#include <dlfcn.h>
#include <cstdio>
int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { std::printf("dlopen failed: %s\n", dlerror()); return 1; }
  auto answer = reinterpret_cast<int (*)()>(dlsym(lib, "answer"));
  std::printf("answer=%d\n", answer ? answer() : -1);
  return 0;
}
"""


def jit_build() -> None:
    """Compile a shared library and a program that dlopens it, under $HOME, and run the program."""
    work = os.path.join(os.environ["HOME"], "jit")
    os.makedirs(work, exist_ok=True)
    for name, text in (("answer.cpp", JIT_LIB), ("main.cpp", JIT_MAIN)):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    cxx = os.environ.get("CXX", "c++")
    steps = [[cxx, "-shared", "-fPIC", "-O1", "-o", "libanswer.so", "answer.cpp"],
             [cxx, "-O1", "-o", "main", "main.cpp", "-ldl"], ["./main", os.path.join(work, "libanswer.so")]]
    for argv in steps:
        r = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"standin: jit step {argv} failed ({r.returncode}): {r.stdout}{r.stderr}", flush=True)
            exit_now(5)
    print(f"standin: jit ok: {r.stdout.strip()} (built in {work})", flush=True)


def helper_child() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


def progress_then_stall():
    every = float(os.environ.get("STANDIN_PROGRESS_EVERY", "0.2"))
    end = started + float(os.environ.get("STANDIN_STALL_AFTER", "1.0"))
    shard = 0
    while time.monotonic() < end:
        shard += 1
        print(f"standin: Loading safetensors checkpoint shards: step {shard}", flush=True)
        time.sleep(every)
    print("standin: Capturing CUDA graphs (bs=256)", flush=True)  # the last line before the hang



def import_heavy() -> None:
    """What SGLang's three processes each import (torch, transformers, SGLang): standin_heavy.py."""
    sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
    try:
        import standin_heavy  # noqa: F401 (imported for its cost and its line in STANDIN_IMPORT_LOG)
    except ImportError:
        pass  # copied alone (the NixOS VM test)


def name_itself(title: str) -> None:
    """SGLang's children set their process title (setproctitle, "sglang::scheduler" and the like):
    what ps, top and doctor's GPU lines show for them."""
    try:
        import setproctitle
    except ImportError:
        return  # copied alone (the NixOS VM test)
    setproctitle.setproctitle(title)


def die_with_parent() -> None:
    """SGLang's kill_itself_when_parent_died: PR_SET_PDEATHSIG = SIGKILL."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def scheduler_process(writer) -> None:
    die_with_parent()
    parent = os.getppid()  # SGLang: psutil.Process().parent(), told with SIGQUIT when this fails
    try:
        import_heavy()
        name_itself("sglang::scheduler")
        writer.send({"status": "ready", "pid": os.getpid()})
        fail_after = os.environ.get("STANDIN_SCHEDULER_FAIL_AFTER")
        time.sleep(float(fail_after) if fail_after else 1e9)
        raise RuntimeError("standin: Scheduler hit an exception: CUDA error: an illegal memory access")
    except Exception as e:
        print(f"standin: scheduler: {e}", flush=True)
        if os.environ.get("STANDIN_DEATH_FILE"):  # when the failure happened, for the tests' clock
            with open(os.environ["STANDIN_DEATH_FILE"], "w") as f:
                f.write(repr(time.time()))
        os.kill(parent, signal.SIGQUIT)


def detokenizer_process() -> None:
    die_with_parent()
    import_heavy()
    name_itself("sglang::detokenizer")
    while True:
        time.sleep(3600)


def descendants(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        return found
    return found + [d for c in found for d in descendants(c)]


def on_sigquit(signum, frame) -> None:
    """SGLang's launch-phase handler: a child failed; kill the process tree, this process last."""
    print("standin: Received sigquit from a child process. It usually means the child failed.", flush=True)
    kill_children()
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGQUIT)


def watch_children(children: list) -> None:
    """SGLang's SubprocessWatchdog: once a second, a child that is gone ends the server."""
    while True:
        time.sleep(1.0)
        for proc in children:
            if not proc.is_alive() and proc.exitcode != 0:
                print(f"standin: Subprocess {proc.name} (pid={proc.pid}) crashed with exit code "
                      f"{proc.exitcode}. Triggering SIGQUIT for cleanup...", flush=True)
                os.kill(os.getpid(), signal.SIGQUIT)
                return


def start_children() -> None:
    """As SGLang's launch: spawn start method, scheduler, detokenizer, wait for the scheduler."""
    signal.signal(signal.SIGQUIT, on_sigquit)
    mp.set_start_method("spawn", force=True)
    reader, writer = mp.Pipe(duplex=False)
    scheduler = mp.Process(target=scheduler_process, args=(writer,), name="scheduler_0")
    scheduler.start()
    detokenizer = mp.Process(target=detokenizer_process, name="detokenizer")
    detokenizer.start()
    while not reader.poll(5.0):
        if not scheduler.is_alive():
            print(f"standin: Rank 0 scheduler died during initialization (exit code: {scheduler.exitcode})", flush=True)
            os._exit(1)
    reader.recv()
    if os.environ.get("STANDIN_CHILD_PIDFILE"):
        with open(os.environ["STANDIN_CHILD_PIDFILE"], "w") as f:
            json.dump({"scheduler": scheduler.pid, "detokenizer": detokenizer.pid}, f)
    threading.Thread(target=watch_children, args=([scheduler, detokenizer],), daemon=True).start()


def run_server() -> None:
    import_heavy()
    # What the mode does runs from the server's start, beside its children's start (which a loaded
    # machine or the fast start's template may make slow): a crash or a stall does not wait for them.
    if mode == "crash":
        threading.Thread(target=crash_later, daemon=True).start()
    if mode == "die-after-ready":
        threading.Thread(target=die_after_ready, daemon=True).start()
    if mode == "stall":
        threading.Thread(target=progress_then_stall, daemon=True).start()
    if os.environ.get("STANDIN_SGLANG_CHILDREN", "1") != "0" and mode != "silent":
        start_children()
    for _ in range(int(os.environ.get("STANDIN_CHILDREN", "0"))):
        if os.fork() == 0:
            helper_child()
    if os.environ.get("STANDIN_MARK") == "1":
        jit = [os.environ[v] for v in JIT_CACHES if v in os.environ]
        for directory in {os.environ["HOME"], os.environ["HF_HOME"], *jit}:  # HOME and HF_HOME: often one
            os.makedirs(directory, exist_ok=True)  # the JIT caches' directories are made by their tools
            with open(os.path.join(directory, "standin-starts"), "a") as f:
                f.write(f"{os.getpid()} {os.getuid()}\n")
    if os.environ.get("STANDIN_JIT") == "1":
        jit_build()
    if mode == "silent":
        while True:
            time.sleep(3600)
    time.sleep(float(os.environ.get("STANDIN_LISTEN_AFTER", "0")))  # SGLang listens only after its imports
    try:
        httpd = http.server.ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        print(f"standin: cannot listen on {host}:{port}: {e}", flush=True)
        wait_for_own_warm_up()
    quiet = "--log-level" in args and args[args.index("--log-level") + 1] in ("warning", "error", "critical")
    if mode in ("healthy", "die-after-ready") and not quiet:  # an INFO line, once its warm-up reached it
        threading.Thread(target=announce_warm_up, daemon=True).start()
    httpd.serve_forever()


def wait_for_own_warm_up() -> None:
    """SGLang 0.5.11 whose bind failed does not exit: uvicorn's shutdown joins SGLang's warm-up thread,
    which asks the port (another program's now) for /model_info, up to 120 times a second apart with a
    5 s timeout each, and then kills its process tree, itself included (seen on an H100: serve still
    waited 290 s after the port was taken). Where the holder answers (another SGLang), the warm-up goes
    on against it and logs its line; then uvicorn's exit ends the process (launch_server's `finally`
    kills the children first)."""
    import urllib.request
    for _ in range(120):
        time.sleep(1)
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/model_info", timeout=5) as r:
                answered = r.status == 200
        except OSError:
            continue
        if answered:
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] The server is fired up and ready to roll!", flush=True)
            kill_children()
            sys.exit(1)
    print("standin: Initialization failed. warmup error: no answer on the port", flush=True)
    kill_children()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_children() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def announce_warm_up() -> None:
    """SGLang's INFO line once its own warm-up request returned (its status Up), in its log format."""
    time.sleep(max(0.0, started + ready_after - time.monotonic()))
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] The server is fired up and ready to roll!", flush=True)


if IS_SERVER:
    run_server()
