"""A rollout's canary: fixed greedy prompts against one instance alone, before and after its restart.

The instance is out of the router and drained when the canary runs, so nothing shares its batch and
greedy decoding is deterministic: the same model, weights and kernels give the same token ids.
The prompts are token ids (accepted with or without a tokenizer, `--skip-tokenizer-init` or not)
below 1000, which every vocabulary has. Each request is SGLang's native non-streamed `/generate`,
whose answer carries `output_ids` and, for a speculative instance, `meta_info.spec_accept_length`.
"""

import http.client
import json
import random
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from dflashctl.errors import DflashError

SEED = 20261201  # fixed: the canary asks the same questions on every host and every rollout


def prompts(count: int, length: int = 16) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(count)]


@dataclass(frozen=True)
class Answers:
    outputs: list[list[int]]  # generated ids, one list per prompt
    accept_length: float | None  # mean over the prompts; None for a plain (non-speculative) instance
    seconds: float

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "accept_length": self.accept_length, "seconds": round(self.seconds, 3)}

    @classmethod
    def from_json(cls, d: dict) -> "Answers":
        return cls([list(map(int, o)) for o in d["outputs"]], d.get("accept_length"), float(d.get("seconds", 0)))


@dataclass(frozen=True)
class Divergence:
    prompt: int
    position: int
    before: int | None  # None: the sequence had ended
    after: int | None

    def describe(self) -> str:
        return (f"prompt {self.prompt} first differs at token {self.position} "
                f"({self.before} before, {self.after} after)")


def request(base_url: str, path: str, api_key: str | None, body: dict | None = None,
            timeout: float = 60.0) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; status 0 when nothing answered."""
    u = urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        conn.request("POST" if body is not None else "GET", path,
                     body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e).encode()
    finally:
        conn.close()


def decodes(base_url: str, api_key: str | None, timeout: float = 60.0) -> bool:
    """SGLang's own readiness: /health_generate decodes one token (the router's /health is the same)."""
    return request(base_url, "/health_generate", api_key, timeout=timeout)[0] == 200


def requests_in_flight(base_url: str, api_key: str | None) -> int | None:
    """Running plus waiting requests (SGLang 0.5.11's /v1/loads); None when it does not say."""
    status, body = request(base_url, "/v1/loads?include=core", api_key, timeout=5)
    if status != 200:
        return None
    try:
        return int(json.loads(body)["aggregate"]["total_reqs"])
    except (ValueError, KeyError, TypeError):
        return None


def ask(base_url: str, api_key: str | None, questions: list[list[int]], max_new_tokens: int,
        timeout: float = 120.0) -> Answers:
    """Every prompt once, greedy, exactly `max_new_tokens` tokens. DflashError on any failure."""
    t0 = time.monotonic()
    outputs, accepts = [], []
    for i, ids in enumerate(questions):
        body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens,
                                                      "ignore_eos": True}}
        status, raw = request(base_url, "/generate", api_key, body, timeout)
        if status != 200:
            raise DflashError(f"the canary's request {i} to {base_url}/generate failed",
                              f"HTTP {status}: {raw[:300].decode(errors='replace')}" if status else
                              raw.decode(errors="replace"),
                              "read the instance's journal (`journalctl -u dflash-<name>`)")
        try:
            answer = json.loads(raw)
            got = [int(t) for t in answer["output_ids"]]
            meta = answer.get("meta_info") or {}
        except (ValueError, KeyError, TypeError) as e:
            raise DflashError(f"the canary's request {i} got an answer without output ids",
                              f"{type(e).__name__}: {raw[:200].decode(errors='replace')}",
                              "the instance must be SGLang's native /generate (a generation model)") from None
        if len(got) != max_new_tokens:
            raise DflashError(f"the canary's request {i} decoded {len(got)} tokens, not {max_new_tokens}",
                              "ignore_eos was set, so every request must decode exactly that many",
                              "read the instance's journal: its decode path is broken")
        outputs.append(got)
        if isinstance(meta.get("spec_accept_length"), (int, float)):
            accepts.append(float(meta["spec_accept_length"]))
    mean = round(sum(accepts) / len(accepts), 3) if accepts else None
    return Answers(outputs, mean, time.monotonic() - t0)


def first_divergence(before: Answers, after: Answers) -> Divergence | None:
    for p, (a, b) in enumerate(zip(before.outputs, after.outputs)):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return Divergence(p, at, a[at] if at < len(a) else None, b[at] if at < len(b) else None)
    if len(before.outputs) != len(after.outputs):
        p = min(len(before.outputs), len(after.outputs))
        return Divergence(p, 0, None, None)
    return None
