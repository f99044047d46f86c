"""`python -m sglang.launch_server` for tests: serves recorded SGLang responses on --port.

Reads FAKE_SGLANG_RECORDINGS/<run>.json (the format `dflashctl smoke --record` writes; the run is
$DFLASHCTL_SMOKE_RUN as smoke sets it, else baseline or the --speculative-algorithm) and answers /health_generate, /server_info, /model_info and streamed /generate like
SGLang 0.5.11: cumulative `output_ids`, `meta_info` on every chunk, the speculative counters on the
last one, then `data: [DONE]`. Constrained requests (a regex, ebnf, json_schema or structural_tag in
sampling_params, and POST /v1/chat/completions) are answered from the recording's "grammar" list,
matched on path and body (the model name aside), with the recorded status and JSON. /server_info
reports skip_tokenizer_init, grammar_backend, constrained_json_disable_any_whitespace and, where
given, max_running_requests and cuda_graph_bs as this process was started, so tests see the flags
smoke passed. An unstreamed /generate (`"stream": false`) gets the last chunk alone, as SGLang answers.

FAKE_SGLANG_DIE=start        exit 1 while "loading" (after FAKE_SGLANG_DIE_AFTER s), an error in the log
FAKE_SGLANG_DIE=generate:N   on the N-th /generate, after its first chunk: the server process exits
                             while a forked helper keeps the sockets open (as SGLang's scheduler
                             can), so only a client that watches the process notices at once
FAKE_SGLANG_DIE=...@RUN       only in the server of RUN (baseline, DFLASH, DDTREE)
FAKE_SGLANG_READY_AFTER=S    /health_generate answers 503 for S seconds (default 0.3);
                             FAKE_SGLANG_READY_AFTER_<RUN> for one run
FAKE_SGLANG_HELPER_PIDFILE   where the forked helper writes its pid (tests check it is gone)
FAKE_SGLANG_API_KEY=KEY      answer 401 unless `Authorization: Bearer KEY` (as --api-key does)
FAKE_SGLANG_DIVERGE_AFTER=N[@RUN]  every /generate after the N-th answers its last token one higher
                             (a server that goes wrong only under a later, heavier load)

It logs SGLang's own start-up markers (with milliseconds under SGLANG_LOG_MS=1, as SGLang does),
spread over the FAKE_SGLANG_READY_AFTER seconds, so smoke's start-up phases have lines to read.
"""

import argparse
import datetime
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--model-path")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--speculative-algorithm")
p.add_argument("--skip-tokenizer-init", action="store_true")
p.add_argument("--grammar-backend")
p.add_argument("--constrained-json-disable-any-whitespace", action="store_true")
p.add_argument("--max-running-requests", type=int)
p.add_argument("--cuda-graph-bs", type=int, nargs="+")
args, _unknown = p.parse_known_args()

# smoke names each server's run in its environment (DFLASH and DFLASH-poisoned share an algorithm)
run = os.environ.get("DFLASHCTL_SMOKE_RUN") or args.speculative_algorithm or "baseline"
with open(os.path.join(os.environ["FAKE_SGLANG_RECORDINGS"], f"{run}.json")) as f:
    REC = json.load(f)
BY_PROMPT = {json.dumps(g["request"].get("input_ids") or g["request"].get("text")): g
             for g in REC["generate"]}


def grammar_key(path, body):
    return json.dumps({"path": path, "body": {k: v for k, v in body.items() if k != "model"}}, sort_keys=True)


GRAMMAR = {grammar_key(g["request"]["path"], g["request"]["body"]): g for g in REC.get("grammar") or []}
SERVER_INFO = {**REC["server_info"], "skip_tokenizer_init": args.skip_tokenizer_init,
               "grammar_backend": args.grammar_backend,
               "constrained_json_disable_any_whitespace": args.constrained_json_disable_any_whitespace}
for key in ("max_running_requests", "cuda_graph_bs"):
    if getattr(args, key) is not None:
        SERVER_INFO[key] = getattr(args, key)
DIE, _, DIE_RUN = os.environ.get("FAKE_SGLANG_DIE", "").partition("@")
if DIE_RUN and DIE_RUN != run:
    DIE = ""
DIVERGE_AFTER, _, DIVERGE_RUN = os.environ.get("FAKE_SGLANG_DIVERGE_AFTER", "").partition("@")
DIVERGE_AFTER = int(DIVERGE_AFTER) if DIVERGE_AFTER and DIVERGE_RUN in ("", run) else None
READY_AT = time.monotonic() + float(os.environ.get(f"FAKE_SGLANG_READY_AFTER_{run}",
                                                   os.environ.get("FAKE_SGLANG_READY_AFTER", "0.3")))
generate_count = 0
count_lock = threading.Lock()


def log(msg):
    print(f"[fake sglang {run}] {msg}", flush=True)


def sglang_log(msg):
    """A line as SGLang 0.5.11's configure_logger formats it."""
    now = datetime.datetime.now()
    ms = f".{now.microsecond // 1000:03d}" if os.environ.get("SGLANG_LOG_MS") == "1" else ""
    print(f"[{now:%Y-%m-%d %H:%M:%S}{ms}] {msg}", flush=True)


def first_use_jit():
    """SGLang compiles its JIT kernels at their first call, inside the first capture: the
    synthetic pair's five, each unless the cache has it (jit_kernel/_build.py); the H200's
    fresh start also built resolve_future_token_ids, last, just before the first decode."""
    from sglang.jit_kernel import activation, kvcache, norm, resolve_future_token_ids, rope
    from sglang.jit_kernel._build import load_jit
    calls = [("qknorm", 64, "torch.bfloat16"), ("fused_rope", True, 64, "torch.bfloat16"), ("kvcache", 1024),
             ("activation", "torch.bfloat16"), ("resolve_future_token_ids", "torch.int64")]
    assert norm and rope and kvcache and activation and resolve_future_token_ids  # the prewarm's loaders
    built = sum(load_jit(*c) for c in calls)
    log(f"JIT at first use: built {built}, found {len(calls) - built} in the cache")


def start_up_lines():
    """SGLang's markers, in its order: imports done, each model loads, each runner captures."""
    step = max(0.0, READY_AT - time.monotonic()) / 8
    models = ["Qwen3ForCausalLM"] + (["DFlashDraftModel"] if args.speculative_algorithm else [])
    sglang_log(f"server_args=ServerArgs(model_path={args.model_path!r}, port={args.port})")
    time.sleep(step)
    sglang_log("Init torch distributed begin.")
    for m in models:
        time.sleep(step)
        sglang_log("Load weight begin. avail mem=139.21 GB")
        time.sleep(step / 2)
        sglang_log(f"Load weight end. elapsed={step / 2:.2f} s, type={m}, avail mem=138.90 GB, mem usage=0.31 GB.")
    for i, _ in enumerate(models):
        time.sleep(step / 2)
        sglang_log("Capture cuda graph begin. This can take up to several minutes. avail mem=137.00 GB")
        if i == 0:
            first_use_jit()
        time.sleep(step / 2)
        sglang_log(f"Capture cuda graph end. Time elapsed: {step / 2:.2f} s. mem usage=0.10 GB. avail mem=136.90 GB.")


log(f"server_args: {' '.join(sys.argv[1:])}")
log(f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', '')}")
log(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
API_KEY = os.environ.get("FAKE_SGLANG_API_KEY")
if DIE == "start":
    time.sleep(float(os.environ.get("FAKE_SGLANG_DIE_AFTER", "0")))
    log("Load weight begin.")
    print("RuntimeError: CUDA error: out of memory (replayed failure)", flush=True)
    sys.exit(1)


def chunks(rec):
    """The stream SGLang sends for one request: cumulative ids, final meta_info last."""
    final = rec["final"]
    ids = final.get("output_ids") or []
    base_meta = {k: v for k, v in final["meta_info"].items()
                 if not k.startswith("spec_") and k != "e2e_latency"}
    for n in rec["chunk_tokens"][:-1]:
        yield {"output_ids": ids[:n], "meta_info": {**base_meta, "completion_tokens": n,
                                                       "finish_reason": None}}
    yield final


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *a):
        log(fmt % a)

    def _json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refused(self):
        if API_KEY and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._json({"error": "Unauthorized"}, 401)
            return True
        return False

    def do_GET(self):
        if self._refused():
            return
        if self.path in ("/health", "/health_generate"):
            if time.monotonic() < READY_AT or not FIRED_UP.is_set():
                return self._json({"detail": "loading"}, 503)
            return self._json({})
        if self.path == "/server_info":
            return self._json(SERVER_INFO)
        if self.path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": args.model_path, "object": "model",
                                                           "owned_by": "sglang", "root": args.model_path}]})
        if self.path == "/model_info":
            return self._json({"model_path": args.model_path, "is_generation": True})
        self._json({"detail": "Not Found"}, 404)

    def do_POST(self):
        global generate_count
        if self._refused():
            return
        if self.path not in ("/generate", "/v1/chat/completions"):
            return self._json({"detail": "Not Found"}, 404)
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        constrained = any(k in (req.get("sampling_params") or {})
                          for k in ("regex", "ebnf", "json_schema", "structural_tag"))
        if self.path != "/generate" or constrained:
            rec = GRAMMAR.get(grammar_key(self.path, req))
            if rec is None:
                log(f"no recorded answer for {grammar_key(self.path, req)[:300]}")
                return self._json({"error": {"message": "no recorded response for this constrained request"}},
                                  404)
            return self._json(rec["response"], rec["status"] or 500)
        prompt = json.dumps(req.get("input_ids") or req.get("text"))
        rec = BY_PROMPT.get(prompt)
        if rec is None:
            return self._json({"error": {"message": f"no recorded response for prompt {prompt[:80]}"}}, 400)
        want = req["sampling_params"]["max_new_tokens"]
        if want != rec["request"]["sampling_params"]["max_new_tokens"]:
            rec = _shortened(rec, want)
        with count_lock:
            generate_count += 1
            n = generate_count
        if DIVERGE_AFTER is not None and n > DIVERGE_AFTER:
            rec = json.loads(json.dumps(rec))
            rec["final"]["output_ids"][-1] += 1
        if not req.get("stream"):  # SGLang's answer to an unstreamed request: the last chunk alone
            return self._json(rec["final"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, chunk in enumerate(chunks(rec)):
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            if i == 0 and DIE == f"generate:{n}":
                _die()
            time.sleep(0.001)
        self.wfile.write(b"data: [DONE]\n\n")


def _shortened(rec, want):
    """A warm-up asks for fewer tokens than recorded: cut the recording."""
    final = json.loads(json.dumps(rec["final"]))
    final["output_ids"] = final.get("output_ids", [])[:want]
    final["meta_info"]["completion_tokens"] = min(want, final["meta_info"]["completion_tokens"])
    steps = [min(n, want) for n in rec["chunk_tokens"] if n < want] + [want]
    return {"request": rec["request"], "chunk_tokens": steps, "final": final}


def _die():
    if os.fork() == 0:  # the helper keeps every socket open, silent, until its group is killed
        pidfile = os.environ.get("FAKE_SGLANG_HELPER_PIDFILE")
        if pidfile:
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
        time.sleep(3600)
        os._exit(0)
    pidfile = os.environ.get("FAKE_SGLANG_HELPER_PIDFILE")
    while pidfile and not os.path.exists(pidfile):  # the test must learn the helper's pid
        time.sleep(0.01)
    log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access was encountered")
    log("Received sigquit from a child process. It usually means the child failed.")
    os._exit(1)


ThreadingHTTPServer.request_queue_size = 2048  # uvicorn's backlog: a burst of connections is queued, not reset
server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
log(f"Uvicorn running on http://{args.host}:{args.port}")


FIRED_UP = threading.Event()


def announce():
    start_up_lines()
    time.sleep(max(0.0, READY_AT - time.monotonic()))
    sglang_log("The server is fired up and ready to roll!")
    FIRED_UP.set()


threading.Thread(target=announce, daemon=True).start()
server.serve_forever()
