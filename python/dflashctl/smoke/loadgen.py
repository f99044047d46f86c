"""Requests against SGLang's native /generate and what each one measured.

Every request streams (`"stream": true`): the time of the first chunk that carries a token is the
time to first token, the last chunk's `meta_info` holds the token count and the speculative
counters (`spec_verify_ct`, `spec_accept_length`). One streamed request thus gives TTFT, latency
and throughput at once, with no separate 1-token probe. Standard library only (http.client).
"""

import http.client
import json
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from dflashctl.errors import DflashError

# Real text for servers with a tokenizer; token ids for those started with --skip-tokenizer-init.
TEXT_PROMPTS = (
    "Explain in a few paragraphs how a hash table handles collisions.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the steps to bake a loaf of sourdough bread, with timings.",
    "Describe the water cycle to a ten-year-old.",
    "Compare TCP and UDP, and say when you would use each.",
    "Write a Python function that merges two sorted lists, and explain it.",
    "Summarise the causes of the French Revolution.",
    "Give advice to someone starting to learn the piano as an adult.",
)


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port, no trailing slash
    api_key: str | None = None


def token_prompts(count: int, length: int, seed: int, vocab_hi: int = 1000) -> list[list[int]]:
    """`count` prompts of `length` token ids drawn from [10, vocab_hi): the same for the same seed.

    Ids below 1000 exist in every vocabulary, so the same prompts suit any target."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab_hi) for _ in range(length)] for _ in range(count)]


def text_prompts(count: int) -> list[str]:
    return [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(count)]


def payload(prompt: list[int] | str, max_new_tokens: int, stream: bool = True) -> dict:
    """Greedy, fixed length (ignore_eos): every run decodes the same number of tokens. Not
    streamed (`stream` False), the answer is one JSON object: no time to first token, no chunks."""
    body = {"input_ids": prompt} if isinstance(prompt, list) else {"text": prompt}
    body["sampling_params"] = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    body["stream"] = stream
    return body


def _connection(ep: Endpoint, timeout: float) -> tuple[http.client.HTTPConnection, dict, str]:
    u = urlsplit(ep.base_url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    headers = {"Content-Type": "application/json"}
    if ep.api_key:
        headers["Authorization"] = f"Bearer {ep.api_key}"
    return cls(u.hostname, u.port, timeout=timeout), headers, u.path.rstrip("/")


def get_json(ep: Endpoint, path: str, timeout: float = 30) -> dict:
    """GET a JSON endpoint (/server_info, /model_info); DflashError on any failure."""
    conn, headers, prefix = _connection(ep, timeout)
    try:
        conn.request("GET", prefix + path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise DflashError(f"GET {ep.base_url}{path} answered HTTP {resp.status}",
                              body[:300].decode(errors="replace"), _fix_for(resp.status))
        return json.loads(body)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        raise DflashError(f"GET {ep.base_url}{path} failed", f"{type(e).__name__}: {e}",
                          "check that the server runs and --url points at it") from None
    finally:
        conn.close()


def _fix_for(status: int) -> str:
    if status in (401, 403):
        return "pass the service's key with --api-key-file"
    return "read the server log"


@dataclass
class RequestResult:
    index: int  # prompt number
    output_tokens: int = 0  # meta_info.completion_tokens of the last chunk
    ttft_s: float | None = None  # first chunk carrying a token, client clock
    e2e_s: float = 0.0  # request sent -> last chunk, client clock
    server_e2e_s: float | None = None  # meta_info.e2e_latency
    spec_verify_ct: int = 0  # absent from meta_info when SGLang verified nothing
    spec_accept_length: float | None = None
    finish_reason: str | None = None
    chunks: int = 0
    error: str | None = None
    output_ids: list[int] | None = None  # the generated token ids (lossless check); not in the JSON
    commits: list[int] | None = None  # tokens each streamed chunk added (acceptance.py); not in the JSON


@dataclass
class Recording:
    """What a request sent and got, compact enough to replay (tests/data/smoke)."""
    request: dict
    chunk_tokens: list[int] = field(default_factory=list)  # completion_tokens after each chunk
    final: dict | None = None  # the last chunk as sent


def _tokens_in(chunk: dict) -> int:
    meta = chunk.get("meta_info") or {}
    if isinstance(meta.get("completion_tokens"), int):
        return meta["completion_tokens"]
    return len(chunk.get("output_ids") or [])


def generate(ep: Endpoint, index: int, body: dict, timeout: float,
             on_tokens: Callable[[int], None] | None = None,
             recording: Recording | None = None) -> RequestResult:
    """One POST /generate, streamed unless the body says otherwise; failures end up in `.error`,
    never raised."""
    r = RequestResult(index)
    conn, headers, prefix = _connection(ep, timeout)
    t0 = time.perf_counter()
    last: dict | None = None
    seen = 0
    counts: list[int] = []  # completion_tokens after each chunk
    deltas: list[int] | None = []  # ids of an incremental stream; None once it proves cumulative
    try:
        conn.request("POST", prefix + "/generate", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return r
        if not body.get("stream"):
            last = json.loads(resp.read())
            last = last[0] if isinstance(last, list) and last else last  # SGLang's batch form
            if not isinstance(last, dict) or "error" in last:
                r.error = f"server error: {last.get('error') if isinstance(last, dict) else last!r}"[:300]
                return r
            r.chunks, deltas = 1, None
            if on_tokens is not None:
                on_tokens(_tokens_in(last))
        while body.get("stream"):
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                r.error = f"server error: {chunk['error']}"
                return r
            r.chunks += 1
            last = chunk
            deltas = _collect(deltas, chunk, r.chunks)
            n = _tokens_in(chunk)
            if n > 0 and r.ttft_s is None:
                r.ttft_s = time.perf_counter() - t0
            if on_tokens is not None and n > seen:
                on_tokens(n - seen)
            seen = max(seen, n)
            counts.append(n)
            if recording is not None:
                recording.chunk_tokens.append(n)
        r.e2e_s = time.perf_counter() - t0
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        r.e2e_s = time.perf_counter() - t0
        r.error = f"{type(e).__name__}: {e}"
        return r
    finally:
        conn.close()
    if last is None:
        r.error = "the stream ended without a single chunk"
        return r
    if recording is not None:
        recording.final = last
    meta = last.get("meta_info") or {}
    r.output_tokens = _tokens_in(last)
    r.output_ids = _output_ids(last, deltas, r.output_tokens)
    r.commits = [b - a for a, b in zip([0] + counts, counts) if b > a] if body.get("stream") else None
    r.server_e2e_s = meta.get("e2e_latency")
    r.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
    r.spec_accept_length = meta.get("spec_accept_length")
    fr = meta.get("finish_reason")
    r.finish_reason = fr.get("type") if isinstance(fr, dict) else fr
    return r


def _collect(deltas: list[int] | None, chunk: dict, k: int) -> list[int] | None:
    """SGLang streams cumulative ids (each chunk holds all so far) unless started with
    --incremental-streaming-output (each chunk holds its new ids). Collect ids until a later
    chunk shows the stream is cumulative: then the last chunk alone holds them all."""
    ids = chunk.get("output_ids") or []
    if deltas is None or (k > 1 and ids and len(ids) == _tokens_in(chunk)):
        return None
    deltas.extend(ids)
    return deltas


def _output_ids(last: dict, deltas: list[int] | None, n: int) -> list[int] | None:
    """The request's generated ids; None when the stream did not carry them all."""
    final = last.get("output_ids")
    if isinstance(final, list) and len(final) == n:
        return list(final)
    return deltas if deltas is not None and len(deltas) == n else None


@dataclass
class PhaseResult:
    name: str  # "sequential" or "concurrent"
    concurrency: int
    wall_s: float
    requests: list[RequestResult]

    def to_json(self) -> dict:
        return {"name": self.name, "concurrency": self.concurrency, "wall_s": round(self.wall_s, 4),
                "requests": [{k: v for k, v in asdict(r).items() if k not in ("output_ids", "commits")}
                             for r in self.requests]}


class Progress:
    """A line on stderr every `every` seconds while requests run."""

    def __init__(self, label: str, total: int, say: Callable[[str], None], every: float = 2.0):
        self.label, self.total, self.say, self.every = label, total, say, every
        self.tokens = 0
        self.done = 0
        self._lock = threading.Lock()
        self._t0 = self._last = time.monotonic()

    def add_tokens(self, n: int) -> None:
        with self._lock:
            self.tokens += n

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self.every:
            self._last = now
            self.say(f"{self.label}: {self.done}/{self.total} requests done, {self.tokens} tokens, "
                     f"{now - self._t0:.0f}s")


def run_phase(ep: Endpoint, name: str, bodies: list[dict], concurrency: int, timeout: float,
              watch: Callable[[], None], say: Callable[[str], None],
              recordings: list[Recording] | None = None) -> PhaseResult:
    """Send `bodies` with at most `concurrency` in flight; `watch()` runs every 0.2 s and raises
    (DflashError) when the server process has died, so a crash ends the phase within a second."""
    progress = Progress(name, len(bodies), say)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"smoke-{name}")
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    try:
        pending = set()
        for i, body in enumerate(bodies):
            rec = None
            if recordings is not None:
                rec = Recording(request=body)
                recordings.append(rec)
            pending.add(pool.submit(generate, ep, i, body, timeout, progress.add_tokens, rec))
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for f in done:
                results.append(f.result())
                progress.done += 1
            watch()
            progress.tick()
        wall = time.perf_counter() - t0
    finally:
        # On a crash the workers' sockets close with the server; do not wait for them.
        pool.shutdown(wait=False, cancel_futures=True)
    results.sort(key=lambda r: r.index)
    return PhaseResult(name, concurrency, wall, results)
