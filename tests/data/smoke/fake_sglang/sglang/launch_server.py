"""`python -m sglang.launch_server` for tests: a server that decodes from its flags and each request.

The command line is parsed as SGLang 0.5.11 parses it (sglang/srt/server_args.py here: every
argument of the locked wheel, plus the DDTree patch): a flag or choice 0.5.11 does not have exits
2 with argparse's message before anything listens. The models are those --model-path and
--speculative-draft-model-path name, read as SGLang would (standin_model.py): random weights under
--load-format dummy, else the checkpoint's own rule. Nothing of dflashctl's is read: not its
environment, not its code.

Each request is answered from itself, with SGLang 0.5.11's defaults and JSON shapes:
- POST /generate: `input_ids`, or `text` (refused under --skip-tokenizer-init; encoded as bytes);
  `sampling_params` with max_new_tokens (128), temperature (1.0: sampled, so outputs change
  between calls; greedy only at temperature 0 or top_k 1), ignore_eos (false: an EOS ends the
  request), min_new_tokens, stop_token_ids, sampling_seed; an unknown key is refused, as
  SamplingParams(**params) refuses it. `"stream": true` gives server-sent events: cumulative
  `output_ids` and `meta_info` on every chunk, one chunk per decode step (the prefill's token,
  then one per verify step under DFLASH), the speculative counters on the last, then
  `data: [DONE]`; without it one JSON answer.
- constrained requests (regex, ebnf, json_schema or structural_tag in sampling_params, and
  /v1/chat/completions with response_format or tools): a speculative server refuses them with
  SGLang 0.5.11's HTTP 400; any other answers from FAKE_SGLANG_GRAMMAR (a recording as `dflashctl
  smoke --record` writes it: its "grammar" list, matched on path and body, the model name aside),
  with the recorded status and JSON.
- POST /v1/chat/completions and /v1/completions without constraints: decoded like /generate from
  the messages' or prompt's text (max_tokens or max_completion_tokens, temperature, stream).
- GET /health, /health_generate, /server_info (every ServerArgs field as parsed, the version, and
  internal_states[0].avg_spec_accept_length over what it served), /model_info, /v1/models.

Faults and timing, for tests (SEL: `baseline`, the --speculative-algorithm, or the draft model
directory's name, such as draft-poisoned):
FAKE_SGLANG_FAULTS=JSON      a list of {"kind", "server": SEL, "prompt": ids or text, "at": N}; kind
                             diverge (the token at position N, negative: from the request's end,
                             is off by one and decoding follows it; with "after": M only in the
                             /generate requests after the M-th, a server that goes wrong under a
                             later, heavier load), empty (no tokens), inactive
                             (a speculative server that verifies nothing), accept-all (every draft
                             accepted: the drafter named is not the one used), no-ids (answers
                             without output_ids, as through a proxy that drops them), grammar-served
                             (a speculative server answers constraints from FAKE_SGLANG_GRAMMAR)
FAKE_SGLANG_DIE=start        exit 1 while "loading" (after FAKE_SGLANG_DIE_AFTER s), an error in the log
FAKE_SGLANG_DIE=generate:N   on the N-th /generate, after its first chunk: the server process exits
                             while a forked helper keeps the sockets open (as SGLang's scheduler
                             can), so only a client that watches the process notices at once
FAKE_SGLANG_DIE=...@SEL      only in that server
                             (N and M above count the /generate requests a client sends, not
                             serve's readiness token, which sets log_metrics false)
FAKE_SGLANG_READY_AFTER=S    /health_generate answers 503 for S seconds (default 0.3);
                             FAKE_SGLANG_READY_AFTER_<SEL> for one server
FAKE_SGLANG_STEP_S=S         time one decode or verify step takes (default 0.001)
FAKE_SGLANG_HELPER_PIDFILE   where the forked helper writes its pid (tests check it is gone)
FAKE_SGLANG_BIND_WHEN=DIR    bind the port only once the file DIR/<port> exists (SGLang binds last,
                             after its model load), so a test can take the port first; a port it
                             cannot bind is logged as uvicorn does (`[Errno 98] error while
                             attempting to bind on address ...`), exit 1
--api-key KEY                answer 401 unless `Authorization: Bearer KEY`, as SGLang does (its
                             health and metrics routes stay open)

It logs SGLang's own start-up markers (with milliseconds under SGLANG_LOG_MS=1, as SGLang does),
spread over the FAKE_SGLANG_READY_AFTER seconds, so smoke's start-up phases have lines to read.
"""

import datetime
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sglang import standin_model as model
from sglang.srt import server_args as fake_server_args

args = fake_server_args.prepare_server_args(sys.argv[1:])
FIELDS = fake_server_args.strict_args().server_info_fields(args)
VERSION = "0.5.11"
ALGORITHM = args.speculative_algorithm
DRAFT = args.speculative_draft_model_path
NAMES = {ALGORITHM or "baseline"} | ({Path(DRAFT).name} if DRAFT else set())
NAME = ALGORITHM or "baseline"
if DRAFT and Path(DRAFT).name not in ("draft", ""):
    NAME = f"{NAME}:{Path(DRAFT).name}"
TOKENIZER = not args.skip_tokenizer_init
STEP_S = float(os.environ.get("FAKE_SGLANG_STEP_S", "0.001"))
SAMPLING_KEYS = {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
                 "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
                 "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                 "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
                 "logit_bias", "sampling_seed"}  # SamplingParams.__init__ of 0.5.11
CONSTRAINTS = ("regex", "ebnf", "json_schema", "structural_tag")
REFUSAL = "{algorithm} speculative decoding does not support grammar-constrained decoding yet."


def selected(sel: str | None) -> bool:
    return not sel or sel in NAMES


def _env_for_me(prefix: str, default: str) -> str:
    for n in sorted(NAMES):
        if f"{prefix}_{n}" in os.environ:
            return os.environ[f"{prefix}_{n}"]
    return os.environ.get(prefix, default)


FAULTS = [f for f in json.loads(os.environ.get("FAKE_SGLANG_FAULTS") or "[]") if selected(f.get("server"))]
DIE, _, DIE_SEL = os.environ.get("FAKE_SGLANG_DIE", "").partition("@")
if not selected(DIE_SEL):
    DIE = ""
READY_AT = time.monotonic() + float(_env_for_me("FAKE_SGLANG_READY_AFTER", "0.3"))
generate_count = 0
count_lock = threading.Lock()
served = {"tokens": 0, "verify": 0}


def log(msg):
    print(f"[fake sglang {NAME}] {msg}", flush=True)


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
    models = ["Qwen3ForCausalLM"] + (["DFlashDraftModel"] if ALGORITHM else [])
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
if DIE == "start":
    time.sleep(float(os.environ.get("FAKE_SGLANG_DIE_AFTER", "0")))
    log("Load weight begin.")
    print("RuntimeError: CUDA error: out of memory (replayed failure)", flush=True)
    sys.exit(1)

TARGET, EOS = model.load_target(args.model_path, args.load_format == "dummy")
DRAFTER = None
BLOCK = 1
if ALGORITHM:
    DRAFTER = model.load_drafter(DRAFT, args.speculative_draft_load_format == "dummy", TARGET)
    BLOCK = model.block_size(DRAFT, args.speculative_num_draft_tokens or args.speculative_dflash_block_size)
log(f"target {type(TARGET).__name__}, drafter {type(DRAFTER).__name__ if DRAFTER else None}, block {BLOCK}")


def _grammar_answers() -> dict:
    path = os.environ.get("FAKE_SGLANG_GRAMMAR")
    if not path:
        return {}
    recs = json.loads(Path(path).read_text()).get("grammar") or []
    return {grammar_key(g["request"]["path"], g["request"]["body"]): g for g in recs}


def grammar_key(path, body):
    return json.dumps({"path": path, "body": {k: v for k, v in body.items() if k != "model"}}, sort_keys=True)


GRAMMAR = _grammar_answers()


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def encode(text: str) -> list[int]:
    """The stand-in's tokenizer: UTF-8 bytes, shifted past the special id 0."""
    return [b + 3 for b in text.encode()]


def detokenize(ids: list[int]) -> str:
    return "".join(chr(32 + (t % 95)) for t in ids)


def sampling(params: dict) -> model.Sampling:
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise Refused(400, f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'")
    s = model.Sampling()
    for k in ("max_new_tokens", "temperature", "top_k", "ignore_eos", "min_new_tokens", "stop_token_ids",
              "sampling_seed"):
        if params.get(k) is not None:
            setattr(s, k, params[k])
    if s.temperature < 0:
        raise Refused(400, f"temperature must be non-negative, got {s.temperature}.")
    if s.max_new_tokens < 0:
        raise Refused(400, f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
    return s


def fault_for(prompt, kind: str) -> dict | None:
    return next((f for f in FAULTS if f["kind"] == kind and ("prompt" not in f or f["prompt"] == prompt)), None)


def run(prompt_ids: list[int], prompt_key, s: model.Sampling, n: int = 0) -> model.Decoded:
    """Decode one request; `n`: its place among the /generate requests (0: another route)."""
    if fault_for(prompt_key, "empty"):
        return model.Decoded([], [0], {"type": "length", "length": 0})
    diverge = {}
    for f in FAULTS:
        if f["kind"] == "diverge" and ("prompt" not in f or f["prompt"] == prompt_key) and n > f.get("after", -1):
            at = f["at"] if f["at"] >= 0 else s.max_new_tokens + f["at"]
            diverge[at] = 1
    drafter = None if fault_for(prompt_key, "inactive") else DRAFTER
    try:
        d = model.decode(TARGET, drafter, BLOCK, prompt_ids, s, EOS, diverge,
                         accept_all=bool(fault_for(prompt_key, "accept-all")))
    except ValueError as e:
        raise Refused(400, str(e)) from None
    if d.verify_ct:  # SGLang counts verify steps only: a prefill-only request (one token) adds nothing
        with count_lock:
            served["tokens"] += len(d.ids)
            served["verify"] += d.verify_ct
    return d


SEEN_PROMPTS: set = set()  # the radix cache: a prompt sent before is served from it, all but its last token


def cached_tokens(ids: list[int]) -> int:
    key = tuple(ids)
    with count_lock:
        hit = key in SEEN_PROMPTS
        SEEN_PROMPTS.add(key)
    return len(ids) - 1 if hit else 0


def meta(rid: str, d: model.Decoded, n_prompt: int, cached: int, final: bool, e2e: float, upto: int) -> dict:
    m = {"id": rid, "finish_reason": d.finish if final else None, "prompt_tokens": n_prompt,
         "weight_version": "default", "total_retractions": 0, "reasoning_tokens": 0, "completion_tokens": upto,
         "cached_tokens": cached, "cached_tokens_details": {"device": cached, "host": 0}, "dp_rank": None}
    if final:
        m["e2e_latency"] = e2e
        if d.verify_ct:
            m.update({"spec_accept_rate": d.accepted / d.proposed, "spec_accept_length": len(d.ids) / d.verify_ct,
                      "spec_accepted_drafts": d.accepted, "spec_proposed_drafts": d.proposed,
                      "spec_verify_ct": d.verify_ct})
    return m


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
        """--api-key guards every route but health and metrics (SGLang's auth middleware)."""
        if self.path.startswith(("/health", "/metrics")):
            return False
        if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
            self._json({"error": "Unauthorized"}, 401)
            return True
        return False

    def _events(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _event(self, obj):
        self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
        self.wfile.flush()

    def do_GET(self):
        if self._refused():
            return
        if self.path in ("/health", "/health_generate"):
            if time.monotonic() < READY_AT or not FIRED_UP.is_set():
                return self._json({"detail": "loading"}, 503)
            return self._json({})
        if self.path in ("/server_info", "/get_server_info"):
            avg = served["tokens"] / served["verify"] if served["verify"] else None
            state = {"last_gen_throughput": 0.0, "memory_usage": {"weight": 0.3, "kvcache": 1.0, "graph": 0.1}}
            if ALGORITHM:
                state["avg_spec_accept_length"] = avg
            return self._json({**FIELDS, "status": "ready", "max_total_num_tokens": args.max_total_tokens,
                               "max_req_input_len": None, "internal_states": [state], "version": VERSION})
        if self.path == "/v1/models":
            name = args.served_model_name or args.model_path
            return self._json({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "sglang",
                                                           "root": name}]})
        if self.path in ("/model_info", "/get_model_info"):
            return self._json({"model_path": args.model_path, "tokenizer_path": args.model_path,
                               "is_generation": True})
        self._json({"detail": "Not Found"}, 404)

    def do_POST(self):
        if self._refused():
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path not in ("/generate", "/v1/chat/completions", "/v1/completions"):
            return self._json({"detail": "Not Found"}, 404)
        try:
            req = json.loads(raw)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return self._json({"error": {"message": f"JSON decode error: {e}"}}, 400)
        try:
            if self._constrained(req):
                return self._grammar(req)
            if self.path == "/generate":
                return self._generate(req)
            return self._openai(req)
        except Refused as e:
            return self._json({"error": {"message": str(e), "code": e.status}}, e.status)

    def _constrained(self, req) -> bool:
        if self.path == "/generate":
            return any(req.get("sampling_params", {}).get(k) is not None for k in CONSTRAINTS)
        return bool(req.get("response_format") and req["response_format"].get("type") != "text"
                    or req.get("tools"))

    def _grammar(self, req):
        if ALGORITHM and not any(f["kind"] == "grammar-served" for f in FAULTS):
            return self._json({"error": {"message": REFUSAL.format(algorithm=ALGORITHM)}}, 400)
        rec = GRAMMAR.get(grammar_key(self.path, req))
        if rec is None:
            log(f"no recorded answer for {grammar_key(self.path, req)[:300]}")
            return self._json({"error": {"message": "the stand-in has no recorded answer for this constrained "
                                                    "request (FAKE_SGLANG_GRAMMAR)"}}, 404)
        return self._json(rec["response"], rec["status"] or 500)

    def _prompt(self, req) -> tuple[list[int], object]:
        if req.get("input_ids") is not None:
            ids = req["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise Refused(400, "input_ids must be a non-empty list of token ids")
            return ids, ids
        if req.get("text") is not None:
            if not TOKENIZER:
                raise Refused(400, "text prompts need a tokenizer: this server runs with --skip-tokenizer-init; "
                                   "send input_ids")
            return encode(req["text"]), req["text"]
        raise Refused(400, "either text or input_ids should be provided")

    def _generate(self, req):
        global generate_count
        ids, key = self._prompt(req)
        s = sampling(req.get("sampling_params") or {})
        t0 = time.monotonic()
        with count_lock:  # serve's readiness token (log_metrics false) is not one of the requests faults count
            generate_count += req.get("log_metrics") is not False
            n = generate_count
        d = run(ids, key, s, n)
        rid = uuid.uuid4().hex
        stream = req.get("stream") is True
        cached = cached_tokens(ids)

        no_ids = fault_for(key, "no-ids")

        def answer(upto: int, final: bool) -> dict:
            a = {"output_ids": d.ids[:upto],
                 "meta_info": meta(rid, d, len(ids), cached, final, time.monotonic() - t0, upto)}
            if no_ids:
                del a["output_ids"]
            return {"text": detokenize(d.ids[:upto]), **a} if TOKENIZER else a
        if not stream:
            time.sleep(STEP_S * len(d.commits))
            return self._json(answer(len(d.ids), True))
        self._events()
        upto = 0
        for i, c in enumerate(d.commits):
            time.sleep(STEP_S)
            upto += c
            self._event(answer(upto, i == len(d.commits) - 1))
            if i == 0 and DIE == f"generate:{n}":
                _die()
        self._event(b"[DONE]")

    def _openai(self, req):
        chat = self.path == "/v1/chat/completions"
        if chat:
            text = "".join(f"<|{m.get('role')}|>{m.get('content') or ''}\n" for m in req.get("messages") or [])
        else:
            text = req.get("prompt") if isinstance(req.get("prompt"), str) else ""
        if not text:
            raise Refused(400, "messages are required" if chat else "prompt is required")
        params = {"max_new_tokens": req.get("max_completion_tokens") or req.get("max_tokens") or 128,
                  "temperature": req.get("temperature", 1.0), "ignore_eos": req.get("ignore_eos", False)}
        if req.get("top_k") is not None:
            params["top_k"] = req["top_k"]
        ids = encode(text)
        d = run(ids, text, sampling(params))
        rid, created, name = uuid.uuid4().hex, int(time.time()), req.get("model") or args.model_path
        finish = "stop" if d.finish["type"] == "stop" else "length"
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(d.ids), "total_tokens": len(ids) + len(d.ids)}
        if req.get("stream"):
            self._events()
            upto = 0
            for i, c in enumerate(d.commits):
                time.sleep(STEP_S)
                piece = detokenize(d.ids[upto:upto + c])
                upto += c
                last = i == len(d.commits) - 1
                choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": finish if last else None}
                          if chat else {"index": 0, "text": piece, "finish_reason": finish if last else None})
                self._event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                             "created": created, "model": name, "choices": [choice]})
            self._event(b"[DONE]")
            return
        time.sleep(STEP_S * len(d.commits))
        out = detokenize(d.ids)
        choice = ({"index": 0, "message": {"role": "assistant", "content": out, "tool_calls": None,
                                           "reasoning_content": None}, "finish_reason": finish}
                  if chat else {"index": 0, "text": out, "finish_reason": finish})
        self._json({"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": name, "choices": [choice], "usage": usage})


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
bind_when = os.environ.get("FAKE_SGLANG_BIND_WHEN")
while bind_when and not os.path.exists(os.path.join(bind_when, str(args.port))):
    time.sleep(0.02)  # SGLang binds its port last, after loading the model: a window to lose it in
try:
    server = ThreadingHTTPServer((args.host, args.port), Handler)
except OSError as e:  # as uvicorn reports a port it cannot bind (asyncio's words), then exit 1
    print(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
          f"{(args.host, args.port)!r}: {(e.strerror or '').lower()}", flush=True)
    sys.exit(1)
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
