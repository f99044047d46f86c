"""smoke/loadgen.py against a scripted HTTP server in this process: what it sends, and what it makes
of SGLang's streamed answers (ids, steps, counters, time to first token) and of failures."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dflashctl.errors import DflashError
from dflashctl.smoke import loadgen

DATA = Path(__file__).resolve().parent.parent / "data" / "smoke"


def test_payload_asks_for_greedy_fixed_length_streams():
    assert loadgen.payload([5, 6], 7) == {"input_ids": [5, 6], "stream": True,
                                          "sampling_params": {"temperature": 0, "max_new_tokens": 7, "ignore_eos": True}}
    assert loadgen.payload("hi", 3) == {"text": "hi", "stream": True,
                                        "sampling_params": {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}}


def test_prompts_are_the_same_for_a_seed_and_inside_every_vocabulary():
    a, b = loadgen.token_prompts(3, 40, 0), loadgen.token_prompts(3, 40, 0)
    assert a == b and len(a) == 3 and all(len(p) == 40 for p in a)
    assert a != loadgen.token_prompts(3, 40, 1) and a[0] != a[1]
    ids = {t for p in loadgen.token_prompts(200, 40, 2) for t in p}
    assert min(ids) == 10 and max(ids) == 999  # [10, 1000): ids every vocabulary has
    assert {t for p in loadgen.token_prompts(50, 40, 2, vocab_hi=12) for t in p} == {10, 11}
    # the default smoke's prompts are those SGLang answered on the H200 (tests/data/smoke/h200-oracle)
    h200 = json.loads((DATA / "h200-oracle" / "baseline.json").read_text())["generate"]
    assert loadgen.token_prompts(8, 32, 0) == [g["request"]["input_ids"] for g in h200]
    first = "Explain in a few paragraphs how a hash table handles collisions."
    assert loadgen.text_prompts(10)[8] == loadgen.text_prompts(10)[0] == first and len(set(loadgen.text_prompts(8))) == 8
    assert loadgen.text_prompts(2)[1] == "Write a short story about a lighthouse keeper who finds a message in a bottle."


class Scripted:
    """A server answering each request from `answer(handler, body)`; records what it got."""

    def __init__(self, answer):
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append(("GET", self.path, dict(self.headers), None))
                answer(self, None)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(("POST", self.path, dict(self.headers), body))
                answer(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(answer):
        s = Scripted(answer)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def reply(h, status: int, data: bytes, kind="application/json"):
    h.send_response(status)
    h.send_header("Content-Type", kind)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def stream(chunks: list, done=True, junk=(), gap=0.0, space=b" ", gap_after=None):
    """An event stream of `chunks` (`gap` seconds after the first, and after chunk `gap_after`),
    `junk` lines before them."""
    def answer(h, body):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for line in junk:
            h.wfile.write(line)
        for i, c in enumerate(chunks):
            h.wfile.write(b"data:" + space + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n")
            h.wfile.flush()
            if i in (0, gap_after) and gap:
                time.sleep(gap)
        if done:
            h.wfile.write(b"data: [DONE]\n\n")
            try:  # after [DONE] nothing is read: the client may be gone already
                h.wfile.write(b"data: " + json.dumps({"output_ids": [9], "meta_info": {}}).encode() + b"\n\n")
            except OSError:
                pass
    return answer


def chunk(ids, n, **meta):
    return {"output_ids": ids, "meta_info": {"completion_tokens": n, **meta}}


SPEC = {"spec_verify_ct": 2, "spec_accept_length": 2.5, "finish_reason": {"type": "length", "length": 5},
        "e2e_latency": 0.25}


def test_a_streamed_answer_gives_ids_steps_counters_and_a_recording(scripted):
    s = scripted(stream([chunk([7], 1), chunk([7, 8, 9], 3), chunk([7, 8, 9, 10, 11], 5, **SPEC)],
                        junk=[b": keep-alive\n\n", b"event: x\n"]))
    seen, rec = [], loadgen.Recording(request={"x": 1})
    before = time.perf_counter()
    r = loadgen.generate(loadgen.Endpoint(s.url, "key"), 4, {"input_ids": [1], "stream": True}, 10, seen.append, rec)
    elapsed = time.perf_counter() - before
    assert r.error is None and r.index == 4 and 0 < r.e2e_s <= elapsed
    assert (r.output_tokens, r.output_ids, r.commits, r.chunks) == (5, [7, 8, 9, 10, 11], [1, 2, 2], 3)
    assert (r.spec_verify_ct, r.spec_accept_length, r.server_e2e_s, r.finish_reason) == (2, 2.5, 0.25, "length")
    assert 0 < r.ttft_s <= r.e2e_s
    assert seen == [1, 2, 2]  # new tokens as they arrive
    assert rec.chunk_tokens == [1, 3, 5] and rec.final == chunk([7, 8, 9, 10, 11], 5, **SPEC)
    method, path, headers, body = s.requests[0]
    assert (method, path, body) == ("POST", "/generate", {"input_ids": [1], "stream": True})
    assert headers["Authorization"] == "Bearer key" and headers["Content-Type"] == "application/json"


def test_an_incremental_stream_and_a_plain_finish_reason(scripted):
    s = scripted(stream([chunk([7], 1), chunk([8, 9], 3), chunk([10], 4, finish_reason="stop")], space=b""))
    r = loadgen.generate(loadgen.Endpoint(s.url), 0, {"stream": True}, 10)
    assert (r.output_ids, r.commits, r.finish_reason, r.spec_verify_ct, r.spec_accept_length) == (
        [7, 8, 9, 10], [1, 2, 1], "stop", 0, None)
    assert "Authorization" not in s.requests[0][2]


def test_an_unstreamed_answer_is_one_json_object(scripted):
    """Without "stream": true (the sweep's requests) SGLang answers with one object, or a list
    of one (its batch form): one chunk, no steps, no time to first token."""
    final = chunk([7, 8, 9], 3, **SPEC)
    for answer in (final, [final]):
        s = scripted(lambda h, b, a=answer: reply(h, 200, json.dumps(a).encode()))
        seen = []
        r = loadgen.generate(loadgen.Endpoint(s.url), 2, {"input_ids": [1]}, 10, seen.append)
        assert r.error is None and r.index == 2
        assert (r.output_tokens, r.output_ids, r.chunks, r.commits, r.ttft_s) == (3, [7, 8, 9], 1, None, None)
        assert (r.spec_verify_ct, r.spec_accept_length, r.finish_reason, seen) == (2, 2.5, "length", [3])
    for answer, error in (({"error": {"message": "boom"}}, "server error: {'message': 'boom'}"),
                          ([], "server error: []"), ("x", "server error: 'x'"),
                          ({"error": "e" * 400}, "server error: '" + "e" * 285)):  # cut at 300 characters
        s = scripted(lambda h, b, a=answer: reply(h, 200, json.dumps(a).encode()))
        r = loadgen.generate(loadgen.Endpoint(s.url), 0, {"stream": False}, 10)
        assert (r.error, r.output_ids, r.output_tokens) == (error, None, 0)


def test_tokens_are_counted_from_ids_without_completion_tokens(scripted):
    s = scripted(stream([{"output_ids": [7]}, {"output_ids": [7, 8]}, {"output_ids": [7, 8, 9], "meta_info": {}}]))
    r = loadgen.generate(loadgen.Endpoint(s.url), 0, {"stream": True}, 10)
    assert (r.output_tokens, r.output_ids, r.commits) == (3, [7, 8, 9], [1, 1, 1])


def test_a_chunk_without_tokens_is_no_first_token(scripted):
    """The first token comes a second after a chunk without one: the time to first token is at
    least that second (the server cannot send it sooner), and a chunk adding nothing is no step."""
    s = scripted(stream([chunk([], 0), chunk([5], 1), chunk([5], 1), chunk([5, 6], 2)], gap=1.0, gap_after=2))
    seen = []
    r = loadgen.generate(loadgen.Endpoint(s.url), 0, {"stream": True}, 10, seen.append)
    assert r.chunks == 4 and r.commits == [1, 1] and r.output_ids == [5, 6] and seen == [1, 1]
    # at the first token: a second after the start, and (by the second gap) well before the end
    assert r.ttft_s >= 1.0 and r.e2e_s - r.ttft_s >= 0.5


def test_ids_the_stream_did_not_carry_are_none():
    """A cumulative stream whose last chunk lost its ids, an incremental one that lost a chunk's."""
    def ids_of(chunks):
        deltas = []
        for k, c in enumerate(chunks, 1):
            deltas = loadgen._collect(deltas, c, k)
        return loadgen._output_ids(chunks[-1], deltas, loadgen._tokens_in(chunks[-1]))
    assert ids_of([chunk([5], 1), chunk([5, 6], 2), {"meta_info": {"completion_tokens": 3}}]) is None
    assert ids_of([chunk([5], 1), chunk([6], 3)]) is None
    assert ids_of([chunk([5], 1), chunk([6, 7], 3)]) == [5, 6, 7]
    assert ids_of([chunk([5, 6], 2)]) == [5, 6]


def test_a_server_that_never_answers_times_the_request_out(scripted):
    s = scripted(lambda h, b: time.sleep(3))
    r = loadgen.generate(loadgen.Endpoint(s.url), 0, {"stream": True}, 0.3)
    assert r.error.startswith("TimeoutError: ")
    phase = loadgen.run_phase(loadgen.Endpoint(s.url), "sequential", [{"stream": True}], 1, 0.3, lambda: None,
                              lambda m: None)
    assert phase.requests[0].error.startswith("TimeoutError: ")  # the phase's timeout reaches each request
    with pytest.raises(DflashError, match="TimeoutError"):
        loadgen.get_json(loadgen.Endpoint(s.url), "/server_info", timeout=0.3)


@pytest.mark.parametrize("answer, error", [
    (lambda h, b: reply(h, 503, b"\xff" + b"loading" * 100), "HTTP 503: \ufffd" + ("loading" * 100)[:299]),
    (stream([chunk([7], 1), {"error": {"message": "boom"}}]), "server error: {'message': 'boom'}"),
    (stream([], done=True), "the stream ended without a single chunk"),
    (stream([], done=False), "the stream ended without a single chunk"),
    (stream([b"{not json"]), "JSONDecodeError: "),
])
def test_failures_end_up_in_the_result(scripted, answer, error):
    s = scripted(answer)
    r = loadgen.generate(loadgen.Endpoint(s.url), 1, {"stream": True}, 10)
    assert (r.error == error if error.startswith("HTTP") else r.error.startswith(error))
    assert r.output_ids is None and r.output_tokens == 0


def test_an_unreachable_server_is_an_error_not_an_exception():
    before = time.perf_counter()
    r = loadgen.generate(loadgen.Endpoint("http://127.0.0.1:9"), 0, {"stream": True}, 5)
    assert r.error.startswith("ConnectionRefusedError: ") and 0 < r.e2e_s <= time.perf_counter() - before


def test_get_json_and_its_failures(scripted):
    s = scripted(lambda h, b: reply(h, 200, b'{"version": "0.5.11"}'))
    assert loadgen.get_json(loadgen.Endpoint(s.url + "/", "k"), "/server_info") == {"version": "0.5.11"}
    assert s.requests[0][:2] == ("GET", "/server_info") and s.requests[0][2]["Authorization"] == "Bearer k"
    prefixed = scripted(lambda h, b: reply(h, 200, b"{}"))
    loadgen.get_json(loadgen.Endpoint(prefixed.url + "/v1/"), "/models")
    assert prefixed.requests[0][1] == "/v1/models"
    for status, fix in ((401, "pass the service's key with --api-key-file"), (403, "pass the service's key"),
                        (500, "read the server log")):
        bad = scripted(lambda h, b, st=status: reply(h, st, b"\xff" + b"x" * 400))
        with pytest.raises(DflashError) as e:
            loadgen.get_json(loadgen.Endpoint(bad.url), "/model_info")
        assert e.value.what == f"GET {bad.url}/model_info answered HTTP {status}"
        assert e.value.why == "\ufffd" + "x" * 299 and e.value.fix.startswith(fix)
    garbled = scripted(lambda h, b: reply(h, 200, b"<html>"))
    with pytest.raises(DflashError) as e:
        loadgen.get_json(loadgen.Endpoint(garbled.url), "/model_info")
    assert e.value.what == f"GET {garbled.url}/model_info failed" and e.value.why.startswith("JSONDecodeError")
    assert e.value.fix == "check that the server runs and --url points at it"
    with pytest.raises(DflashError, match="ConnectionRefusedError"):
        loadgen.get_json(loadgen.Endpoint("http://127.0.0.1:9"), "/x")


def test_https_endpoints_use_tls():
    conn, headers, prefix = loadgen._connection(loadgen.Endpoint("https://h.example:8443/apiX/"), 3)
    assert type(conn).__name__ == "HTTPSConnection" and (conn.host, conn.port, conn.timeout) == ("h.example", 8443, 3)
    assert prefix == "/apiX" and headers == {"Content-Type": "application/json"}
    conn, _, prefix = loadgen._connection(loadgen.Endpoint("http://h:1"), 3)
    assert type(conn).__name__ == "HTTPConnection" and prefix == ""


def test_a_phase_runs_every_body_bounded_and_in_order(scripted):
    lock, state = threading.Lock(), {"now": 0, "most": 0}
    both_in = threading.Event()  # two requests in the handler at once: the bound is reached

    def answer(h, body):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            if state["now"] >= 2:
                both_in.set()
        both_in.wait(2.0)  # held until the second arrives (a loaded machine may take a while), never more
        time.sleep(0.1)  # and a little longer: a third let through beside them would show in "most"
        with lock:  # out before the answer: once answered, the client may send the next at once, and
            state["now"] -= 1  # on a busy machine it can arrive before this thread runs again
        stream([chunk([body["i"]], 1), chunk([body["i"], 0], 2)])(h, body)
    s = scripted(answer)
    watched, said, recs = [], [], []
    bodies = [{"i": i, "stream": True} for i in range(6)]
    before = time.perf_counter()
    phase = loadgen.run_phase(loadgen.Endpoint(s.url), "concurrent", bodies, 2, 10, lambda: watched.append(1),
                              said.append, recs)
    assert (phase.name, phase.concurrency) == ("concurrent", 2) and 0 < phase.wall_s <= time.perf_counter() - before
    assert [r.index for r in phase.requests] == list(range(6))
    assert [r.output_ids for r in phase.requests] == [[i, 0] for i in range(6)]
    assert state["most"] == 2 and watched
    assert [r.request for r in recs] == bodies and all(r.final is not None for r in recs)
    assert loadgen.PhaseResult("sequential", 1, 1.234567, []).to_json() == {
        "name": "sequential", "concurrency": 1, "wall_s": 1.2346, "requests": []}
    out = phase.to_json()
    assert out["name"] == "concurrent" and out["concurrency"] == 2 and out["wall_s"] == round(phase.wall_s, 4)
    assert "output_ids" not in out["requests"][0] and "commits" not in out["requests"][0]
    assert out["requests"][0]["output_tokens"] == 2 and len(out["requests"]) == 6


def test_without_recordings_nothing_is_recorded(scripted):
    s = scripted(stream([chunk([1], 1)]))
    phase = loadgen.run_phase(loadgen.Endpoint(s.url), "sequential", [{"stream": True}], 1, 10, lambda: None, lambda m: None)
    assert phase.requests[0].output_ids == [1] and phase.requests[0].error is None


def test_a_dead_server_ends_the_phase_through_watch_and_nothing_more_is_sent(scripted):
    """watch() raises while a request hangs: the phase ends at once (not when the request does),
    and the requests still queued are never sent."""
    hold, finished = threading.Event(), []

    def answer(h, b):
        hold.wait(5)
        finished.append(1)
    s = scripted(answer)

    def watch():
        raise DflashError("server died", "exit 1", "read the log")
    try:
        with pytest.raises(DflashError, match="server died"):
            loadgen.run_phase(loadgen.Endpoint(s.url), "concurrent", [{"stream": True}] * 3, 1, 30, watch, lambda m: None)
        assert finished == []  # ended while the request still hung
    finally:
        hold.set()
    time.sleep(1.0)
    assert len(s.requests) == 1  # the two queued requests were cancelled


def test_a_long_phase_says_how_far_it_got(scripted):
    """Every 2 s a line: requests done of all, tokens so far, seconds (the last request hangs 2.5 s)."""
    def answer(h, body):
        if body["i"] == 5:
            time.sleep(2.5)
        stream([chunk([1], 1), chunk([1, 2], 2)])(h, body)
    s = scripted(answer)
    said = []
    loadgen.run_phase(loadgen.Endpoint(s.url), "concurrent", [{"i": i, "stream": True} for i in range(6)], 2, 10, lambda: None,
                      said.append)
    assert len(said) == 1 and said[0] == "concurrent: 5/6 requests done, 10 tokens, 2s"


def test_progress_says_how_far_the_phase_is():
    said = []
    p = loadgen.Progress("DFLASH", 8, said.append, every=3600)
    p.add_tokens(5)
    p.add_tokens(7)
    p.done = 2
    p.tick()
    assert said == []  # not yet due
    p.tick(force=True)
    assert said[0].startswith("DFLASH: 2/8 requests done, 12 tokens, ") and said[0].endswith("s")
    q = loadgen.Progress("x", 1, said.append, every=0)
    q.tick()
    assert said[-1].startswith("x: 0/1 requests done, 0 tokens")
