"""A rollout's canary: one instance alone, read before and after its restart, and judged.

The instance is out of the router and drained when the canary runs, so nothing shares its batch and
greedy decoding is deterministic: the same model, weights and kernels give the same token ids. The
prompts are token ids (accepted with or without a tokenizer, `--skip-tokenizer-init` or not) below
1000, which every vocabulary has. `measure` sends each of them `repeats` times, after one warm-up
request that is not counted, as SGLang's native streamed `/generate` (greedy, `ignore_eos`, exactly
`tokens` new tokens), and reads from the same requests: the output ids, the acceptance length
(0.5.11's last `meta_info`: completion_tokens / spec_verify_ct), and the decode speed (tokens after
the first streamed chunk over the client's time from that chunk to the last: the prefill and the
radix cache stay out of it). Each prompt's median over the repeats enters the figures, so a stall in
one repeat does not move them. Its identity is /server_info's fields that name the model, the
drafter and the stack (data/canary.json). canary_verdict.py judges two readings.

The rollout's API (operations/rollout_machine.py's steps "measure before" and "measure after"):

    canary.add_arguments(parser)                 # the rollout's canary flags (--canary-*, --no-canary)
    settings = canary.settings_of(args)          # CanarySettings; DflashError(CONFIG) for nonsense
    # settings.enabled False (--no-canary): nothing below runs
    before = canary.measure(url, key, settings, say)    # out of the router and drained, before the restart
    after = canary.measure(url, key, settings, say)     # ready again, still out of the router
    verdict = canary.judge(before, after, settings)     # before None: it did not answer before
    step.canary = verdict.to_json(); say(f"{name}: canary {verdict.summary()}")
    if not verdict.ok: fail the step with f"{name}: {verdict.what}" and verdict.fix, before putting it back

`measure` never raises for what the instance does: a request that fails (HTTP error, a dropped
connection, a wrong answer, no whole answer within `request_limit(tokens)` seconds) ends the reading
early with the error in `Reading.errors`, which `judge` fails. `Reading.to_json()` keeps the reading
taken before a restart in the rollout's state for `--resume`, `Reading.from_json()` reads it back
(ValueError for what is not one). `extra_identity` adds what the caller knows of the definition
(e.g. the stack's store path) to the identity's "stack" part.

`request`, `decodes`, `decodes_now` and `requests_in_flight` are the rollout's other questions to an
instance.
"""

import http.client
import json
import random
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from dflashctl.errors import CONFIG, DflashError
from dflashctl.operations.canary_verdict import (DATA, DEFAULTS, EXPECT, PARTS, CanarySettings, Divergence,
                                                 Reading, Verdict, finite, judge)
from dflashctl.service.sglang_0_5_11 import READY_DECODE

__all__ = ["CanarySettings", "Divergence", "Reading", "Verdict", "add_arguments", "judge", "measure", "settings_of"]

SEED = 20261201  # fixed: the canary asks the same questions on every host and every rollout


def prompts(count: int, length: int = 16) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(count)]


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


def decodes_now(base_url: str, api_key: str | None, timeout: float = 60.0) -> bool:
    """One greedy token of ours through /generate, answered as soon as it is decoded: a restarted
    instance is ready for its canary. /health_generate would add its fixed second
    (service/sglang_0_5_11.py) and wait for SGLang's own warm-up request; the router's health check
    still waits for both before the instance gets any traffic. An instance that answers but refuses
    that request (a 4xx: a context shorter than its prompt, a model that does not generate, a wrong
    key) is asked /health_generate instead: ready, it goes on to its canary, which names the refusal."""
    status = request(base_url, "/generate", api_key, READY_DECODE, timeout=timeout)[0]
    if status in (0, 503):  # nothing listens yet, or it is not serving
        return False
    return status == 200 or decodes(base_url, api_key, timeout)


def requests_in_flight(base_url: str, api_key: str | None) -> int | None:
    """Running plus waiting requests (SGLang 0.5.11's /v1/loads); None when it does not say."""
    status, body = request(base_url, "/v1/loads?include=core", api_key, timeout=5)
    if status != 200:
        return None
    try:
        return int(json.loads(body)["aggregate"]["total_reqs"])
    except (ValueError, KeyError, TypeError):
        return None


# --- the settings: the rollout's flags -----------------------------------------------------------------
BOUNDS = DATA["bounds"]


def add_arguments(parser) -> None:
    """The canary's flags on the rollout's parser (each default None: settings_of tells given from not)."""
    g = parser.add_argument_group("canary (docs/service.md, \"The canary\")")
    g.add_argument("--no-canary", action="store_true",
                   help="restart without asking the instance anything before and after (nothing is judged)")
    for flag, key, what in (("--canary-prompts", "prompts", "prompts (token ids) per canary"),
                            ("--canary-tokens", "tokens", "greedy tokens decoded per prompt"),
                            ("--canary-repeats", "repeats", "times each prompt is asked; the median counts")):
        lo, hi = BOUNDS[key]
        g.add_argument(flag, type=int, metavar="N", help=f"{what} ({DEFAULTS[key]}; {lo} to {hi})")
    g.add_argument("--canary-min-accept-ratio", type=float, metavar="R",
                   help=f"fail when the acceptance length after the restart is below R x what it was before "
                        f"({DEFAULTS['minAcceptRatio']}; above 0, below 1)")
    g.add_argument("--canary-min-speed-ratio", type=float, metavar="R",
                   help=f"fail when the decode speed (tokens/s) after the restart is below R x what it was before "
                        f"({DEFAULTS['minSpeedRatio']}; above 0, below 1)")
    g.add_argument("--canary-expect", action="append", default=[], metavar="WHAT",
                   help="what this rollout is meant to change, lifting the judgments it would fail (repeat, or "
                        "comma-separated): " + "; ".join(f"{k}: {v['means']}" for k, v in DATA["expect"].items()))


def _count(args, attr: str, key: str) -> int:
    value = getattr(args, attr, None)
    if value is None:
        return DEFAULTS[key]
    lo, hi = BOUNDS[key]
    if not lo <= value <= hi:
        flag = "--" + attr.replace("_", "-")
        raise DflashError(f"{flag} {value} is out of range", f"it must be {lo} to {hi}: {DATA['why'].get(key, '')}",
                          f"pass {flag} between {lo} and {hi}, or leave it out for {DEFAULTS[key]}", CONFIG)
    return value


def _ratio(args, attr: str, key: str) -> float:
    value = getattr(args, attr, None)
    if value is None:
        return DEFAULTS[key]
    if not finite(value) or not 0 < value < 1:
        flag = "--" + attr.replace("_", "-")
        raise DflashError(f"{flag} {value} is out of range",
                          "it must be a number above 0 and below 1: an identical build measures about 1.0, so 1 "
                          "or more would fail it half the time, and 0 would hold nothing",
                          f"pass e.g. {flag} {DEFAULTS[key]} (the default), or name what is meant to change "
                          "with --canary-expect", CONFIG)
    return float(value)


def _expect(words: list[str]) -> frozenset[str]:
    given = {w.strip() for text in words for w in str(text).split(",") if w.strip()}
    unknown = sorted(given - set(EXPECT))
    if unknown:
        raise DflashError(f"--canary-expect {', '.join(unknown)} is not something the canary judges",
                          f"it knows {', '.join(EXPECT)}",
                          "name one of those (repeat the flag, or separate them with commas)", CONFIG)
    return frozenset(given)


def settings_of(args) -> CanarySettings:
    """The canary's settings from add_arguments' flags; DflashError(CONFIG) for a value that makes no sense."""
    if getattr(args, "no_canary", False):
        given = [f for f, v in (("--canary-expect", args.canary_expect), ("--canary-prompts", args.canary_prompts),
                                ("--canary-tokens", args.canary_tokens), ("--canary-repeats", args.canary_repeats),
                                ("--canary-min-accept-ratio", args.canary_min_accept_ratio),
                                ("--canary-min-speed-ratio", args.canary_min_speed_ratio)) if v]
        if given:
            raise DflashError(f"--no-canary and {', '.join(given)} contradict each other",
                              "without a canary nothing is measured or judged", "pass one or the other", CONFIG)
        return CanarySettings(enabled=False)
    return CanarySettings(prompts=_count(args, "canary_prompts", "prompts"),
                          tokens=_count(args, "canary_tokens", "tokens"),
                          repeats=_count(args, "canary_repeats", "repeats"),
                          min_accept_ratio=_ratio(args, "canary_min_accept_ratio", "minAcceptRatio"),
                          min_speed_ratio=_ratio(args, "canary_min_speed_ratio", "minSpeedRatio"),
                          expect_change=_expect(getattr(args, "canary_expect", None) or []))


# --- measuring one instance --------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One streamed request: its ids and what the client's clock and meta_info said of it."""
    ids: list[int]
    ttft_s: float  # request sent -> first chunk carrying a token
    decode_tokens: int  # tokens after that first chunk
    decode_s: float  # first chunk -> last chunk
    verify: float | None  # verify steps: spec_verify_ct, else tokens / spec_accept_length; None: not reported


def _tokens_in(chunk: dict) -> int:
    n = (chunk.get("meta_info") or {}).get("completion_tokens")
    return n if isinstance(n, int) else len(chunk.get("output_ids") or [])


def _sample(final: dict | None, first, last, incremental: list, tokens: int, t0: float) -> Sample | str:
    """The request's Sample from its last chunk, or what was wrong with the answer."""
    if final is None or first is None:
        return "the stream ended without a chunk carrying a token"
    n = _tokens_in(final)
    if n != tokens:
        return f"decoded {n} tokens, not {tokens} (ignore_eos was set: its decode path is broken)"
    ids = final.get("output_ids")
    ids = ids if isinstance(ids, list) and len(ids) == n else incremental  # --incremental-streaming-output
    if len(ids) != n:
        return "the answer does not carry its output ids (output_ids): is this SGLang's native /generate?"
    meta = final.get("meta_info") or {}
    verify, accept = meta.get("spec_verify_ct"), meta.get("spec_accept_length")
    steps = (float(verify) if finite(verify) and verify > 0 else
             n / accept if finite(accept) and accept > 0 else None)
    try:
        return Sample([int(t) for t in ids], first[0] - t0, n - first[1], last[0] - first[0], steps)
    except (TypeError, ValueError):
        return f"output ids that are not token ids: {str(ids)[:100]}"


def _read_stream(resp, t0: float, tokens: int, timeout: float) -> Sample | str:
    first = last = final = None  # (clock, tokens) of the first chunk carrying a token, of the last; last chunk
    incremental: list = []
    for raw in iter(resp.readline, b""):
        if time.perf_counter() - t0 > timeout:
            return f"not answered whole within {timeout:g} s"
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            return f"a streamed chunk that is not JSON: {data[:200].decode(errors='replace')}"
        if not isinstance(chunk, dict) or "error" in chunk:
            return f"server error: {str(chunk.get('error') if isinstance(chunk, dict) else chunk)[:300]}"
        now, n = time.perf_counter(), _tokens_in(chunk)
        if n > 0 and first is None:
            first = (now, n)
        last, final = (now, n), chunk
        incremental.extend(chunk.get("output_ids") or [])
    return _sample(final, first, last, incremental, tokens, t0)


def _headers(api_key: str | None) -> dict:
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}


def request_limit(tokens: int) -> float:
    """Seconds one canary request may take whole (data/canary.json's requestLimit, why there)."""
    limit = DATA["requestLimit"]
    return float(limit["baseSec"] + limit["perTokenSec"] * tokens)


SILENCE_S = 120.0  # no byte from the instance for this long: it hangs, whatever the limit above


def generate(base_url: str, api_key: str | None, ids: list[int], tokens: int, timeout: float) -> Sample | str:
    """One streamed greedy /generate of exactly `tokens` tokens: its Sample, or what went wrong."""
    u = urlsplit(base_url)
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True},
            "stream": True}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=min(timeout, SILENCE_S))
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/generate", body=json.dumps(body), headers=_headers(api_key))
        resp = conn.getresponse()
        if resp.status != 200:
            return f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
        return _read_stream(resp, t0, tokens, timeout)
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def identity(base_url: str, api_key: str | None, extra: dict | None = None) -> dict | str:
    """part -> {field: value} of what /server_info says the instance serves, or what went wrong."""
    status, raw = request(base_url, "/server_info", api_key, timeout=30)
    if status != 200:
        return "GET /server_info: " + (f"HTTP {status}: {raw[:200].decode(errors='replace')}" if status else
                                        raw.decode(errors="replace"))
    try:
        info = json.loads(raw)
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        return f"GET /server_info: {e}"
    out = {part: {f: info[f] for f in fields if f in info} for part, fields in PARTS.items()}
    out["stack"].update(extra or {})
    return out


def _median(xs) -> float:
    return statistics.median(xs)


def _figures(rows: list[list[Sample]]) -> dict:
    """Reading's figures from rows[repeat][prompt]: each prompt's median over the repeats."""
    by_prompt = list(zip(*rows))
    tok = sum(_median([x.decode_tokens for x in ss]) for ss in by_prompt)
    sec = sum(_median([x.decode_s for x in ss]) for ss in by_prompt)
    each = [sum(x.decode_tokens for x in row) / t if (t := sum(x.decode_s for x in row)) > 0 else None
            for row in rows]
    steps = [[x.verify for x in ss] for ss in by_prompt]
    accept = None
    if all(v is not None for vs in steps for v in vs):
        accept = sum(len(ss[0].ids) for ss in by_prompt) / sum(_median(vs) for vs in steps)
    return {"outputs": [ss[0].ids for ss in by_prompt],
            "unstable": [p for p, ss in enumerate(by_prompt) if any(x.ids != ss[0].ids for x in ss)],
            "decode_tps": tok / sec if sec > 0 and tok > 0 else None, "decode_tps_repeats": each,
            "accept_length": accept, "ttft_s": _median([x.ttft_s for row in rows for x in row])}


def measure(base_url: str, api_key: str | None, settings: CanarySettings, say=None,
            extra_identity: dict | None = None, timeout: float | None = None) -> Reading:
    """The instance alone: a warm-up request, then every prompt `settings.repeats` times (module docstring).
    `timeout`: seconds a request may take whole (default request_limit(settings.tokens))."""
    t0 = time.monotonic()
    timeout = timeout or request_limit(settings.tokens)
    questions = prompts(settings.prompts)
    asked = {"prompts": settings.prompts, "tokens": settings.tokens, "repeats": settings.repeats}
    if say:
        say(f"canary: {settings.prompts} prompt(s) x {settings.tokens} greedy tokens, {settings.repeats} time(s) "
            "each after a warm-up")
    who = identity(base_url, api_key, extra_identity)
    if isinstance(who, str):
        return Reading({}, [], errors=[who], seconds=time.monotonic() - t0, **asked)
    warm = generate(base_url, api_key, questions[0], settings.tokens, timeout)
    if isinstance(warm, str):
        return Reading(who, [], errors=[f"the warm-up request: {warm}"], seconds=time.monotonic() - t0, **asked)
    rows = []
    for r in range(settings.repeats):
        row = []
        for p, ids in enumerate(questions):
            got = generate(base_url, api_key, ids, settings.tokens, timeout)
            if isinstance(got, str):
                return Reading(who, [], errors=[f"prompt {p} (repeat {r + 1}): {got}"],
                               seconds=time.monotonic() - t0, **asked)
            row.append(got)
        rows.append(row)
    return Reading(who, **_figures(rows), seconds=time.monotonic() - t0, **asked)
