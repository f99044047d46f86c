"""The stand-in's /metrics (`--enable-metrics`): SGLang 0.5.11's families, from a real recording.

tests/data/metrics/h200/instance-metrics.txt is a DFLASH instance's /metrics recorded on the H200
(the oracle pair). Every family in it is served, in its order, with its HELP and TYPE lines and
label sets (the recorded model path replaced by this stand-in's model). The families a test looks
at move with the stand-in's own requests: requests, prompt and generation tokens, time to first
token, end-to-end latency, token-count histograms, running requests, token usage and generation
throughput; the speculative acceptance length is a gauge a test sets (the stand-in reads it from
STANDIN_ACCEPT_LENGTH_FILE at each scrape) and the acceptance rate follows it. One family is not in
the recording, because it is observed only for streamed requests: `sglang:inter_token_latency_seconds`,
named and bucketed as in SGLang 0.5.11's source (observability/metrics_collector.py); its HELP text
is SGLang's too. As in SGLang, a non-streamed request's first token is its last (time to first
token = end-to-end latency), and inter-token latency is observed per streamed chunk.
"""

import collections
import math
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# In the repository, or beside this file where a test copied both (the systemd tier's container).
RECORDING = next((p for p in (HERE.parent / "metrics" / "h200" / "instance-metrics.txt",
                              HERE / "instance-metrics.txt") if p.exists()), HERE / "instance-metrics.txt")
RECORDED_MODEL = "/tmp/tmp.uIOFWNYgV4/models/oracle-9d82f9511034e837/target"
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
ITL_HELP = "Histogram of inter-token latency in seconds."
MAX_TOTAL_TOKENS = 4096  # what the stand-in's /v1/loads reports as its KV pool


def _families(text: str) -> list[dict]:
    """[{name, help, type, lines}] in the recording's order."""
    out, by_name = [], {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split()[2]
            if name not in by_name:
                by_name[name] = {"name": name, "help": None, "type": None, "lines": []}
                out.append(by_name[name])
            by_name[name]["help" if line.startswith("# HELP ") else "type"] = line
        elif line and not line.startswith("#"):
            base = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_bucket", "_sum", "_count", ""):
                if suffix == "" or base.endswith(suffix):
                    fam = base[: len(base) - len(suffix)] if suffix else base
                    if fam in by_name:
                        by_name[fam]["lines"].append(line)
                        break
    return out


def _first_labels(family: dict, suffix: str = "") -> str:
    """The label text of the family's first sample (without `le`)."""
    for line in family["lines"]:
        if line.split("{", 1)[0] == family["name"] + suffix and "{" in line:
            labels = line.split("{", 1)[1].rsplit("}", 1)[0]
            return ",".join(p for p in _split_labels(labels) if not p.startswith("le="))
    return ""


def _split_labels(text: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"' and not cur.endswith("\\"):
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + ([cur] if cur else [])


def _buckets(family: dict) -> list[float]:
    bounds = []
    for line in family["lines"]:
        if "_bucket{" in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            if le != "+Inf" and float(le) not in bounds:
                bounds.append(float(le))
    return bounds


def _num(v: float) -> str:
    return "+Inf" if v == math.inf else repr(float(v))


class Histogram:
    def __init__(self, bounds: list[float]):
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, v: float) -> None:
        self.sum += v
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, acc = [], 0
        for b, c in zip(self.bounds + [math.inf], self.counts):
            acc += c
            le = "+Inf" if b == math.inf else repr(float(b))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(acc)}' if labels else
                       f'{name}_bucket{{le="{le}"}} {float(acc)}')
        braces = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{braces} {self.sum}", f"{name}_count{braces} {float(acc)}"]


class Registry:
    def __init__(self, model: str, speculative: bool, block_size: int, accept_length):
        escaped = model.replace("\\", "\\\\").replace('"', '\\"')
        self.families = _families(RECORDING.read_text().replace(RECORDED_MODEL, escaped))
        self.by_name = {f["name"]: f for f in self.families}
        self.speculative, self.block_size = speculative, block_size
        self.read_accept_length = accept_length  # the stand-in's own rule (its file, else 15.75)
        self.lock = threading.Lock()
        self.requests = self.prompt_tokens = self.generation_tokens = 0
        self.running, self.used_tokens = 0, 0
        self.recent = collections.deque()  # (monotonic, tokens) of the last few seconds
        self.hist = {n: Histogram(_buckets(self.by_name[n])) for n in (
            "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
            "sglang:generation_tokens_histogram", "sglang:prompt_tokens_histogram")}
        self.hist["sglang:inter_token_latency_seconds"] = Histogram(ITL_BUCKETS)

    # --- what the request handler reports ---------------------------------------------------------
    def started(self, n_in: int) -> None:
        with self.lock:
            self.running += 1
            self.used_tokens += n_in

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.hist["sglang:time_to_first_token_seconds"].observe(seconds)

    def token(self, interval: float | None) -> None:
        """One streamed chunk of one token (`interval`: since the previous chunk)."""
        with self.lock:
            self.used_tokens += 1
            self.recent.append((time.monotonic(), 1))
            if interval is not None:
                self.hist["sglang:inter_token_latency_seconds"].observe(interval)

    def finished(self, n_in: int, n_out: int, e2e: float, streamed: bool) -> None:
        with self.lock:
            self.running -= 1
            self.used_tokens -= n_in + (n_out if streamed else 0)
            self.requests += 1  # SGLang counts requests and their tokens when they finish
            self.prompt_tokens += n_in
            self.generation_tokens += n_out
            if not streamed:
                self.recent.append((time.monotonic(), n_out))
            if not streamed:  # SGLang sees a non-streamed request's first output at its end
                self.hist["sglang:time_to_first_token_seconds"].observe(e2e)
            self.hist["sglang:e2e_request_latency_seconds"].observe(e2e)
            self.hist["sglang:generation_tokens_histogram"].observe(float(n_out))
            self.hist["sglang:prompt_tokens_histogram"].observe(float(n_in))

    def accept_length(self) -> float:
        return self.read_accept_length() if self.speculative else 0.0

    def throughput(self) -> float:
        now = time.monotonic()
        while self.recent and self.recent[0][0] < now - 5:
            self.recent.popleft()
        return sum(n for _, n in self.recent) / 5.0

    # --- /metrics ---------------------------------------------------------------------------------
    def render(self) -> str:
        with self.lock:
            accept = self.accept_length()
            live = {
                "sglang:num_requests_total": float(self.requests),
                "sglang:prompt_tokens_total": float(self.prompt_tokens),
                "sglang:generation_tokens_total": float(self.generation_tokens),
                "sglang:num_running_reqs": float(self.running),
                "sglang:num_queue_reqs": 0.0,
                "sglang:gen_throughput": self.throughput(),
                "sglang:token_usage": max(self.used_tokens, 0) / MAX_TOTAL_TOKENS,
                "sglang:num_used_tokens": float(max(self.used_tokens, 0)),
                "sglang:kv_used_tokens": float(max(self.used_tokens, 0)),
                "sglang:max_total_num_tokens": float(MAX_TOTAL_TOKENS),
                "sglang:spec_accept_length": accept,
                "sglang:spec_accept_rate": (max(accept - 1, 0) / (self.block_size - 1)
                                            if self.speculative and self.block_size > 1 else 0.0),
            }
            out = []
            for fam in self.families:
                name = fam["name"]
                out += [x for x in (fam["help"], fam["type"]) if x]
                if name in self.hist:
                    out += self.hist[name].lines(name, _first_labels(fam, "_sum"))
                elif name in live:
                    labels = _first_labels(fam)
                    out.append(f"{name}{{{labels}}} {_num(live[name])}" if labels else f"{name} {_num(live[name])}")
                else:
                    out += fam["lines"]
                if name == "sglang:time_to_first_token_seconds":  # SGLang declares ITL right after TTFT
                    itl = "sglang:inter_token_latency_seconds"
                    out += [f"# HELP {itl} {ITL_HELP}", f"# TYPE {itl} histogram"]
                    if self.hist[itl].counts and sum(self.hist[itl].counts):  # a labelled histogram
                        out += self.hist[itl].lines(itl, _first_labels(fam, "_sum"))  # appears once observed
        return "\n".join(out) + "\n"
