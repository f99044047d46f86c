"""The grammar phase of `dflashctl smoke`: constrained requests, each output checked against its grammar.

The throughput phases cannot see constrained decoding: without a tokenizer SGLang has no grammar
backend. Yet the story's last two failures were there (xgrammar 0.1.10 lacked `StructuralTag`; the
workaround `--grammar-backend none` left the host unable to serve JSON-schema and tool-call
requests). So a server with a tokenizer gets regex, EBNF, JSON-schema and structural-tag requests
on SGLang's native `/generate`, and JSON-schema and tool-call requests through the OpenAI client
(`/v1/chat/completions`); every output is checked here, independently of the server's grammar
engine. A speculative server gets one constrained request: SGLang 0.5.11 refuses those with DFLASH
(HTTP 400), a limit of that release that the report states plainly.

The grammars keep a random-weight model's output short: booleans and enums, bounded repeats. JSON
needs SGLang's `--constrained-json-disable-any-whitespace` there: with any whitespace allowed, a
random model fills the JSON with tabs and spaces until max_new_tokens (H200: 0 of 5 valid
without it, 5 of 5 with it).
"""

import http.client
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

from dflashctl.errors import DflashError
from dflashctl.smoke import schema
from dflashctl.smoke.loadgen import Endpoint, get_json
from dflashctl.smoke.loadgen import _connection as connection
from dflashctl.smoke.tokenizer import EOS

END_TEXTS = (EOS,)  # the synthetic tokenizer's end-of-text, as it shows in text it was not stripped from

MAX_NEW_TOKENS = 96  # the longest valid output below is about 60 bytes
REGEX = r"(yes|no), [0-9]{1,3} (apples|pears)"
EBNF = ('root ::= greeting " " place "!"\n'
        'greeting ::= "hello" | "bonjour"\n'
        'place ::= "Paris" | "Berlin" | "world"')
EBNF_LANGUAGE = r"(hello|bonjour) (Paris|Berlin|world)!"  # the same language as EBNF, to check with `re`
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"type": "string", "enum": ["red", "green", "blue"]},
                   "size": {"type": "string", "enum": ["S", "M", "L"]}},
    "required": ["ok", "color", "size"],
    "additionalProperties": False,
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TAG_BEGIN, TAG_END = "<call>", "</call>"
# xgrammar's structural-tag "format" form (SGLang hands it to xgrammar as is): <call>{"city":"Paris"}</call>.
# The object's frame is spelled out because a json_schema format inside a tag always allows any
# whitespace (SGLang's whitespace flag does not reach it), which a random model repeats at will.
STRUCTURAL_TAG = {"type": "structural_tag", "format": {
    "type": "tag", "begin": TAG_BEGIN, "end": TAG_END, "content": {"type": "sequence", "elements": [
        {"type": "const_string", "value": '{"city":'},
        {"type": "json_schema", "json_schema": CITY_SCHEMA["properties"]["city"]},
        {"type": "const_string", "value": "}"}]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": CITY_SCHEMA}}]
# A speculative server without a tokenizer takes token ids (ids below 1000 exist in every vocabulary).
PROBE_IDS = list(range(100, 116))
CONSTRAINT_KEYS = ("regex", "ebnf", "json_schema", "structural_tag")
SPECULATIVE_LIMIT = ("a limit of SGLang {version} with {algorithm}, not a failure of this host; send "
                     "structured-output traffic to a non-speculative instance")


@dataclass(frozen=True)
class Case:
    kind: str  # regex, ebnf, json_schema, structural_tag, tool_call
    api: str  # "generate" (SGLang's native API) or "openai" (/v1/chat/completions)
    prompt: str


CASES = (
    Case("regex", "generate", "Answer yes or no, then count some fruit:"),
    Case("ebnf", "generate", "Greet a place:"),
    Case("json_schema", "generate", "Describe a shirt as JSON:"),
    Case("structural_tag", "generate", "Call the weather tool for a city:"),
    Case("json_schema", "openai", "Describe a shirt as JSON."),
    Case("tool_call", "openai", "What is the weather in Paris?"),
)
PROBE = Case("regex", "generate", CASES[0].prompt)


def generate_body(case: Case, token_ids: list[int] | None = None) -> dict:
    """POST /generate: greedy, not streamed, the constraint in sampling_params."""
    constraint = {"regex": REGEX, "ebnf": EBNF, "json_schema": json.dumps(ANSWER_SCHEMA),
                  "structural_tag": json.dumps(STRUCTURAL_TAG)}[case.kind]
    body: dict = {"input_ids": token_ids} if token_ids is not None else {"text": case.prompt}
    body["sampling_params"] = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, case.kind: constraint}
    body["stream"] = False
    return body


def chat_body(case: Case, model: str) -> dict:
    """POST /v1/chat/completions, as keyword arguments of the OpenAI client (= the JSON it sends)."""
    body = {"model": model, "messages": [{"role": "user", "content": case.prompt}],
            "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    if case.kind == "json_schema":
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "shirt", "schema": ANSWER_SCHEMA}}
    else:  # one call only: an open-ended array would let a random model add calls until max_tokens
        body.update(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    return body


# --- checking outputs -------------------------------------------------------------------------------

def _json_problem(text: str, schema_: dict) -> str | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg} at character {e.pos})"
    found = schema.problems(value, schema_)
    return "; ".join(found) if found else None


def text_problem(kind: str, text: str) -> str | None:
    """Why `text` is not in the language of the `kind` constraint above; None when it is."""
    if kind == "regex":
        return None if re.fullmatch(REGEX, text) else f"does not fully match the regex {REGEX}"
    if kind == "ebnf":
        return None if re.fullmatch(EBNF_LANGUAGE, text) else "is not a sentence of the EBNF grammar"
    if kind == "json_schema":
        return _json_problem(text, ANSWER_SCHEMA)
    if kind == "structural_tag":
        if not (text.startswith(TAG_BEGIN) and text.endswith(TAG_END)) or len(text) < len(TAG_BEGIN + TAG_END):
            return f"is not wrapped in {TAG_BEGIN}...{TAG_END}"
        inner = _json_problem(text[len(TAG_BEGIN):-len(TAG_END)], CITY_SCHEMA)
        return f"the tag's content: {inner}" if inner else None
    raise ValueError(kind)


def output_of(case: Case, response: dict) -> tuple[str, str | None]:
    """(the output as shown in the table, why it violates its grammar or None)."""
    if case.api == "generate":
        if not isinstance(response.get("text"), str):
            return "(no text)", "the response has no text (a server without a tokenizer returns only ids)"
        text = response["text"]
        return text, text_problem(case.kind, text)
    message = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
    if case.kind == "json_schema":
        text = message.get("content") or ""
        return text, text_problem("json_schema", text)
    calls = message.get("tool_calls") or calls_in_content(message.get("content") or "")
    if not calls:
        return message.get("content") or "", "no tool call in the answer (content holds the raw output)"
    shown, problems = [], []
    names = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        fn = call.get("function") or {}
        shown.append(f"{fn.get('name')}({fn.get('arguments')})")
        if fn.get("name") not in names:
            problems.append(f"unknown tool {fn.get('name')!r}")
        else:
            p = _json_problem(fn.get("arguments") or "", names[fn["name"]])
            if p:
                problems.append(f"arguments of {fn['name']}: {p}")
    if len(calls) > 1:
        problems.append(f"{len(calls)} calls, but parallel_tool_calls was false")
    return "; ".join(shown), "; ".join(problems) or None


def calls_in_content(content: str) -> list[dict]:
    """Tool calls that SGLang 0.5.11 returns as content: without a `--tool-call-parser`, a
    tool_choice="required" answer is the constrained JSON array of {"name", "parameters"} itself
    (seen on the H200), followed by the EOS text when the chat path keeps special tokens.
    [] when the content is not such an array."""
    text = content.strip()
    for special in END_TEXTS:
        text = text.removesuffix(special).rstrip()
    try:
        items = json.loads(text)
    except ValueError:
        return []
    if not isinstance(items, list) or not items or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return []
    return [{"function": {"name": i["name"], "arguments": json.dumps(i.get("parameters", i.get("arguments")))}}
            for i in items]


# --- sending ----------------------------------------------------------------------------------------

@dataclass
class Row:
    kind: str
    api: str  # "/generate" or "openai client" / "HTTP (no openai)"
    status: str  # ok, violation, error, refused, skipped
    output: str = ""
    problem: str | None = None  # the violation, the error or why skipped/refused
    http_status: int | None = None
    finish_reason: str | None = None
    seconds: float | None = None


@dataclass
class ServerGrammar:
    """What one server did with constrained requests."""
    run: str
    algorithm: str | None
    version: str | None
    tokenizer: bool
    grammar_backend: str | None
    json_whitespace: str  # "fixed" separators with --constrained-json-disable-any-whitespace, else "any"
    client: str = ""  # what sent the OpenAI-API requests
    verdict: str = ""
    rows: list[Row] = field(default_factory=list)

    def failures(self) -> list[str]:
        return [f"grammar: {self.run} {r.kind} via {r.api}: " +
                (f"output violates its grammar: {r.problem} (output: {_clip(r.output)})" if r.status == "violation"
                 else f"request failed: {r.problem}")
                for r in self.rows if r.status in ("violation", "error")]


def _clip(text: str, n: int = 120) -> str:
    """One line: control characters (a random model's tabs and newlines) shown escaped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= n else text[:n - 3] + "..."


@dataclass
class Reply:
    status: int | None  # HTTP status; None: no answer
    body: dict | None
    error: str | None = None


def _post(ep: Endpoint, path: str, body: dict, timeout: float) -> Reply:
    conn, headers, prefix = connection(ep, timeout)
    try:
        conn.request("POST", prefix + path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        return Reply(None, None, f"{type(e).__name__}: {e}")
    finally:
        conn.close()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return Reply(resp.status, None, f"HTTP {resp.status}, not JSON: {raw[:200].decode(errors='replace')}")
    return Reply(resp.status, data if isinstance(data, dict) else {"value": data})


class OpenAIClient:
    """The `openai` package when installed (it parses the answer as OpenAI's own clients do),
    else plain HTTP with the same JSON; `label` says which one ran."""

    def __init__(self, ep: Endpoint, timeout: float):
        self.ep, self.timeout = ep, timeout
        try:
            import openai
        except ImportError as e:
            self.openai, self.client = None, None
            self.label, self.note = "HTTP (no openai)", f"the openai package is not installed ({e}): plain HTTP instead"
            return
        self.openai = openai
        self.client = openai.OpenAI(base_url=ep.base_url + "/v1", api_key=ep.api_key or "none",
                                    max_retries=0, timeout=timeout)
        self.label, self.note = "openai client", f"openai {openai.__version__}"

    def chat(self, body: dict) -> Reply:
        if self.client is None:
            return _post(self.ep, "/v1/chat/completions", body, self.timeout)
        try:
            completion = self.client.chat.completions.create(**body)
        except self.openai.APIStatusError as e:
            data = e.body if isinstance(e.body, dict) else {"message": str(e)}
            return Reply(e.status_code, data)
        except self.openai.APIError as e:  # connection errors, timeouts, answers it cannot parse
            return Reply(None, None, f"{type(e).__name__}: {e}")
        return Reply(200, completion.model_dump(mode="json"))


def _error_text(reply: Reply) -> str:
    if reply.error:
        return reply.error
    body = reply.body or {}
    err = body.get("error")
    msg = err.get("message") if isinstance(err, dict) else (err or body.get("message") or body.get("detail"))
    return f"HTTP {reply.status}: {msg if msg else json.dumps(body)[:300]}"


def _finish(case: Case, body: dict) -> str | None:
    if case.api == "generate":
        fr = (body.get("meta_info") or {}).get("finish_reason")
        return fr.get("type") if isinstance(fr, dict) else fr
    return ((body.get("choices") or [{}])[0] or {}).get("finish_reason")


def served_model(ep: Endpoint, info: dict) -> str:
    """The model name /v1/chat/completions expects (SGLang's --served-model-name or the path)."""
    try:
        data = get_json(ep, "/v1/models").get("data") or []
        if data and data[0].get("id"):
            return data[0]["id"]
    except DflashError:  # an old or proxied server: fall back to /server_info
        pass
    return info.get("served_model_name") or info.get("model_path") or "default"


def check_server(run: str, algorithm: str | None, ep: Endpoint, info: dict, timeout: float,
                 watch: Callable[[], None], say: Callable[[str], None],
                 recordings: list | None = None) -> ServerGrammar:
    """Send the constrained requests to one server and check every answer.

    `info` is its /server_info; `watch()` raises when the server process died (checked every 0.2 s)."""
    sg = ServerGrammar(run, algorithm, info.get("version"), not info.get("skip_tokenizer_init", False),
                       info.get("grammar_backend"),
                       "fixed" if info.get("constrained_json_disable_any_whitespace") else "any")
    client = OpenAIClient(ep, timeout)
    sg.client = client.note
    model = None
    if algorithm is None and not sg.tokenizer:
        why = "no tokenizer (--skip-tokenizer-init): SGLang then runs no grammar backend"
        sg.rows = [Row(c.kind, _api(c, client), "skipped", problem=why) for c in CASES]
        sg.verdict = f"not tested: {why}"
        return sg
    if algorithm is None and sg.grammar_backend == "none":
        why = ("--grammar-backend none: JSON-schema, regex, EBNF, structural-tag and tool-call requests "
               "are refused")
        sg.rows = [Row(c.kind, _api(c, client), "skipped", problem=why) for c in CASES]
        sg.verdict = f"cannot serve structured output: {why}"
        return sg
    cases = (PROBE,) if algorithm else CASES
    for case in cases:
        say(f"{run}: grammar: {case.kind} via {_api(case, client)}")
        if case.api == "generate":
            body = generate_body(case, None if sg.tokenizer else PROBE_IDS)
            path, send = "/generate", (lambda b=body: _post(ep, "/generate", b, timeout))
        else:
            model = model or served_model(ep, info)
            body = chat_body(case, model)
            path, send = "/v1/chat/completions", (lambda b=body: client.chat(b))
        t0 = time.perf_counter()
        reply = _watched(send, watch)
        row = Row(case.kind, _api(case, client), "ok", http_status=reply.status,
                  seconds=round(time.perf_counter() - t0, 3))
        if recordings is not None:
            recordings.append({"kind": case.kind, "api": case.api, "request": {"path": path, "body": body},
                               "status": reply.status, "response": reply.body, "error": reply.error})
        if reply.status == 200 and reply.body is not None:
            row.output, row.problem = output_of(case, reply.body)
            row.finish_reason = _finish(case, reply.body)
            row.status = "violation" if row.problem else "ok"
        elif algorithm and reply.status == 400:
            row.status, row.problem = "refused", _error_text(reply)
        else:
            row.status, row.problem = "error", _error_text(reply)
        sg.rows.append(row)
    sg.verdict = _verdict(sg)
    return sg


def _api(case: Case, client: OpenAIClient) -> str:
    return "/generate" if case.api == "generate" else client.label


def _watched(send: Callable[[], Reply], watch: Callable[[], None]) -> Reply:
    """Run one request while watching the server process (a crash ends the wait within 0.2 s)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smoke-grammar")
    try:
        future = pool.submit(send)
        while True:
            try:
                return future.result(timeout=0.2)
            except TimeoutError:
                watch()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _verdict(sg: ServerGrammar) -> str:
    counts = {s: sum(r.status == s for r in sg.rows) for s in ("ok", "violation", "error", "refused")}
    if sg.algorithm and counts["refused"]:
        return ("refuses constrained requests (HTTP 400): " +
                SPECULATIVE_LIMIT.format(version=sg.version or "?", algorithm=sg.algorithm))
    if counts["ok"] == len(sg.rows):
        backend = f" ({sg.grammar_backend})" if sg.grammar_backend else ""
        return f"serves structured output{backend}: {counts['ok']}/{len(sg.rows)} outputs match their grammars"
    return (f"FAILED: {counts['violation']} output(s) violate their grammar, {counts['error']} request(s) "
            f"failed, of {len(sg.rows)}")


# --- report -----------------------------------------------------------------------------------------

def summary(servers: list[ServerGrammar], tokenizer: dict | None) -> dict:
    """The `grammar` block of smoke's JSON result; `tokenizer`: what tokenizer.write built, if any."""
    failures = [f for s in servers for f in s.failures()]
    client = servers[0].client if servers else ""
    return {"ok": not failures, "failures": failures, "client": client, "tokenizer": tokenizer,
            "servers": [{**{k: v for k, v in asdict(s).items() if k != "rows"},
                         "rows": [asdict(r) for r in s.rows]} for s in servers]}


def merge(result: dict, block: dict) -> None:
    """Add the grammar block to smoke's result: its failures fail the smoke."""
    result["grammar"] = block
    result["failures"] = result["failures"] + block["failures"]
    result["ok"] = result["ok"] and block["ok"]


def table(block: dict) -> str:
    """One row per constrained request: ok, or the failing output and why."""
    head = ("run", "request", "api", "result")
    rows = [head]
    for s in block["servers"]:
        for r in s["rows"]:
            if r["status"] == "ok":
                result = f"ok  {_clip(r['output'], 70)}"
            elif r["status"] == "violation":
                result = f"VIOLATION  {r['problem']}; output: {_clip(r['output'], 70)}"
            else:
                result = f"{r['status'].upper() if r['status'] == 'error' else r['status']}  {r['problem']}"
            rows.append((s["run"], r["kind"], r["api"], result))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["grammar phase: constrained decoding, each output checked against its grammar"
             + (f"; target: {block['target']}" if block.get("target") else "")]
    lines += ["  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths)), r[3]]).rstrip() for r in rows]
    lines.insert(2, "  ".join("-" * w for w in widths) + "  ------")
    lines.append("")
    for s in block["servers"]:
        lines.append(f"{s['run']}: {s['verdict']}")
    tok = block.get("tokenizer")
    if tok:
        lines.append(f"synthetic tokenizer: byte-level BPE, {tok['vocab_size']} tokens, built here in "
                     f"{tok['seconds']:.1f}s (sha256 {tok['sha256'][:16]}); requests: {block['client']}")
    else:
        lines.append(f"requests: {block['client']}")
    for f in block["failures"]:
        lines.append(f"FAILED: {f}")
    return "\n".join(lines)
