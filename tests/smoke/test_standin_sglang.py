"""The stand-in SGLang (tests/data/smoke/fake_sglang, tests/data/service/standin_server.py) is as
strict as SGLang 0.5.11 and answers as it did on the H200.

- its command line: the facts read off the locked wheel (tests/data/sglang), refused as argparse
  refuses (exit 2), and every argv dflashctl builds is accepted;
- its answers: to the requests the H200's SGLang answered (tests/data/smoke/h200*), the same
  output ids, streamed steps and speculative counters for the oracle pair's files (read by the
  stand-in, not told), and the same keys for the random pair;
- the request's parameters decide the answer: temperature, stream, max_new_tokens, ignore_eos.
"""

import json
import runpy
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from smoke_runner import DATA, FAKE, SGLANG_FACTS, env_for

from dflashctl.smoke import oracle, ports, synthetic

sys.path.insert(0, str(SGLANG_FACTS))
import strict_args  # noqa: E402  (tests/data/sglang)

REPO = Path(__file__).resolve().parent.parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"
FACTS = json.loads((SGLANG_FACTS / "server-args-0.5.11.json").read_text())


def test_the_facts_come_from_the_locked_sglang_wheel():
    locked = json.loads((REPO / "nix" / "python-lock.json").read_text())["systems"]["x86_64-linux"]["packages"]["sglang"]
    assert FACTS["sglang"] == locked["version"] == "0.5.11"
    assert FACTS["wheel"] == {"file": locked["file"], "sha256": locked["sha256"]}
    assert len(FACTS["arguments"]) == 374  # ServerArgs.add_cli_args of 0.5.11
    flags = {f: a for a in FACTS["arguments"] for f in a["flags"]}
    assert flags["--speculative-algorithm"]["choices"] == ["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    assert flags["--grammar-backend"]["choices"] == ["xgrammar", "outlines", "llguidance", "none"]
    assert flags["--speculative-dflash-block-size"]["type"] == "int" and "--speculative-ddtree-budget" not in flags


def launch(*argv, fake=FAKE, **env):
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], env=env_for(fake, **env),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv, message", [
    (["--model-path", "m", "--speculative-dflash-blocksize", "16"],
     "unrecognized arguments: --speculative-dflash-blocksize 16"),
    (["--model-path", "m", "--grammar-backend", "xgrammer"], "argument --grammar-backend: invalid choice: 'xgrammer'"),
    (["--model-path", "m", "--mem-fraction-static", "a quarter"],
     "argument --mem-fraction-static: invalid float value: 'a quarter'"),
    (["--port", "30000"], "the following arguments are required: --model-path"),
    (["--model-path", "m", "--speculative-algorithm", "DDTREE"], "argument --speculative-algorithm: invalid choice: 'DDTREE'"),
    (["--model-path", "m", "--speculative-ddtree-budget", "32"], "unrecognized arguments: --speculative-ddtree-budget"),
], ids=["misspelt flag", "invalid choice", "invalid value", "required", "no DDTREE in 0.5.11", "no DDTree budget"])
def test_the_stand_in_refuses_what_sglang_0_5_11_refuses(tmp_path, argv, message):
    from smoke_runner import fake_without_ddtree
    p = launch(*argv, fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.splitlines()[0].startswith("usage: sglang serve")
    assert f"sglang serve: error: {message}" in p.stderr
    assert "Uvicorn running" not in p.stdout  # refused before it listens


def test_the_service_stand_in_refuses_the_same(tmp_path):
    p = subprocess.run([sys.executable, str(STANDIN), "--model-path", "m", "--port", "9", "--tp-sise", "2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "unrecognized arguments: --tp-sise 2" in p.stderr


def test_the_ddtree_patch_adds_its_choice_and_flag_only():
    # the stand-in's server_args.py: the list dflashctl's probe reads, 0.5.11's and DDTREE
    choices = runpy.run_path(str(FAKE / "sglang" / "srt" / "server_args.py"))["SPECULATIVE_CHOICES"]
    released = next(a for a in FACTS["arguments"] if a["flags"][0] == "--speculative-algorithm")["choices"]
    assert [c for c in choices if c != "DDTREE"] == released and "DDTREE" in choices
    ns = strict_args.parse(["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget",
                            "64"], ddtree=True)
    assert (ns.speculative_algorithm, ns.speculative_ddtree_budget) == ("DDTREE", 64)
    # argparse's own rules hold: an unambiguous prefix is the flag (SGLang accepts --tp for --tp-size)
    assert strict_args.parse(["--model-path", "m", "--tp", "2", "--max-total-tokens", "64k"]).tensor_parallel_size == 2
    assert strict_args.parse(["--model", "m", "--context-length", "1Ki"]).context_length == 1024


@pytest.mark.parametrize("case", sorted(p.stem for p in (REPO / "tests" / "data" / "service" / "argv").glob("*.json")))
def test_every_golden_argv_dflashctl_builds_is_one_sglang_accepts(case):
    argv = json.loads((REPO / "tests" / "data" / "service" / "argv" / f"{case}.json").read_text())["argv"]
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    ns = strict_args.parse(argv[3:], ddtree=case == "ddtree")  # DDTREE needs the patched SGLang
    assert ns.model_path == argv[argv.index("--model-path") + 1]


# --- answers -------------------------------------------------------------------------------------

def free_port() -> int:
    return ports.free_port()


class Server:
    def __init__(self, tmp: Path, name: str, *argv: str, fake: Path = FAKE):
        self.port = free_port()
        self.log = open(tmp / f"{name}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), *argv],
                                     env=env_for(fake, FAKE_SGLANG_READY_AFTER="0", TVM_FFI_CACHE_DIR=str(tmp / "tvm")),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health_generate", timeout=2):
                    break
            except (OSError, urllib.error.HTTPError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not come up: {(tmp / f'{name}.log').read_text()[-2000:]}")
                time.sleep(0.05)

    def post(self, body: dict, path: str = "/generate") -> tuple[str, list[dict]]:
        """(content type, [the JSON answer] or the streamed chunks)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            kind, raw = r.headers.get("Content-Type"), r.read().decode()
        if kind == "text/event-stream":
            data = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
            assert data[-1] == "[DONE]"
            return kind, [json.loads(d) for d in data[:-1]]
        return kind, [json.loads(raw)]

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin")
    pair = oracle.write_pair(tmp / "oracle")
    broken = oracle.write_pair(tmp / "broken", oracle.OracleShape(draft_offset_error=-1))  # smoke's --pair broken
    target, draft = synthetic.write_pair(tmp / "random")
    ids = ["--skip-tokenizer-init", "--grammar-backend", "none"]
    spec = ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "16"]
    out = {}
    try:
        out["baseline"] = Server(tmp, "baseline", "--model-path", str(pair.target), *ids)
        out["DFLASH"] = Server(tmp, "DFLASH", "--model-path", str(pair.target), *ids, *spec,
                               "--speculative-draft-model-path", str(pair.draft))
        out["DFLASH-poisoned"] = Server(tmp, "poisoned", "--model-path", str(pair.target), *ids, *spec,
                                        "--speculative-draft-model-path", str(pair.poisoned))
        out["broken"] = Server(tmp, "broken", "--model-path", str(broken.target), *ids, *spec,
                               "--speculative-draft-model-path", str(broken.draft))
        dummy = ["--load-format", "dummy"]
        out["random"] = Server(tmp, "random", "--model-path", str(target), *ids, *dummy)
        out["random-DFLASH"] = Server(tmp, "random-DFLASH", "--model-path", str(target), *ids, *dummy, *spec,
                                      "--speculative-draft-model-path", str(draft),
                                      "--speculative-draft-load-format", "dummy")
        out["random-text"] = Server(tmp, "random-text", "--model-path", str(target), *dummy)
        yield out
    finally:
        for s in out.values():
            s.stop()


def steps(chunks: list[dict]) -> list[int]:
    return [c["meta_info"]["completion_tokens"] for c in chunks]


H200_ORACLE = {"baseline": ("h200-oracle", "baseline"), "DFLASH": ("h200-oracle", "DFLASH"),
               "DFLASH-poisoned": ("h200-oracle", "DFLASH-poisoned"), "broken": ("h200-broken", "DFLASH")}
SPEC = ("spec_accept_rate", "spec_accept_length", "spec_accepted_drafts", "spec_proposed_drafts", "spec_verify_ct")


@pytest.mark.parametrize("server", list(H200_ORACLE))
def test_the_oracle_pairs_answers_are_the_h200s(servers, server):
    """Each of the H200's requests, sent again: the same ids, the same chunks (one per decode or
    verify step), the same speculative counters, the same meta_info keys."""
    d, run = H200_ORACLE[server]
    recorded = json.loads((DATA / d / f"{run}.json").read_text())["generate"]
    assert len(recorded) == 8
    for rec in recorded:
        _, chunks = servers[server].post(rec["request"])
        final, want = chunks[-1], rec["final"]
        assert final["output_ids"] == want["output_ids"]
        assert steps(chunks) == rec["chunk_tokens"]
        assert set(final["meta_info"]) == set(want["meta_info"])
        assert {k: final["meta_info"].get(k) for k in SPEC} == {k: want["meta_info"].get(k) for k in SPEC}
        assert final["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"] == {"type": "length",
                                                                                            "length": 256}


def test_the_random_pairs_answers_have_the_h200s_shape(servers):
    for server, run in (("random", "baseline"), ("random-DFLASH", "DFLASH")):
        rec = json.loads((DATA / "h200" / f"{run}.json").read_text())["generate"][0]
        _, chunks = servers[server].post(rec["request"])
        final = chunks[-1]
        assert set(final) == set(rec["final"]) and set(final["meta_info"]) == set(rec["final"]["meta_info"])
        assert steps(chunks) == rec["chunk_tokens"] == list(range(1, 257))  # random drafts: rejected
        assert all(0 <= t < 151936 for t in final["output_ids"]) and len(final["output_ids"]) == 256
        if run == "DFLASH":
            assert {k: final["meta_info"][k] for k in SPEC} == {k: rec["final"]["meta_info"][k] for k in SPEC}
    _, a = servers["random"].post(rec["request"])
    _, b = servers["random-DFLASH"].post(rec["request"])
    assert a[-1]["output_ids"] == b[-1]["output_ids"]  # one config, one greedy output (as on the H200)


def test_server_info_holds_every_server_args_field_as_the_h200s_did(servers):
    with urllib.request.urlopen(f"http://127.0.0.1:{servers['DFLASH'].port}/server_info") as r:
        info = json.loads(r.read())
    h200 = json.loads((DATA / "h200-oracle" / "DFLASH.json").read_text())["server_info"]
    assert set(info) - {"speculative_ddtree_budget"} == set(h200)
    assert (info["speculative_algorithm"], info["skip_tokenizer_init"], info["tp_size"], info["version"]) == (
        "DFLASH", True, 1, "0.5.11")


PROMPT = list(range(100, 132))


def body(**params) -> dict:
    return {"input_ids": PROMPT, "sampling_params": params}


def test_greedy_only_at_temperature_zero(servers):
    s = servers["random"]
    greedy = [s.post(body(temperature=0, max_new_tokens=64, ignore_eos=True))[1][0]["output_ids"] for _ in range(2)]
    assert greedy[0] == greedy[1]
    assert s.post(body(top_k=1, max_new_tokens=64, ignore_eos=True))[1][0]["output_ids"] == greedy[0]
    sampled = [s.post(body(temperature=0.7, max_new_tokens=64, ignore_eos=True))[1][0]["output_ids"] for _ in range(2)]
    assert sampled[0] != sampled[1] and greedy[0] not in sampled
    # SGLang's default temperature is 1.0: a request that does not say samples
    assert s.post(body(max_new_tokens=64, ignore_eos=True))[1][0]["output_ids"] != greedy[0]
    seeded = [s.post(body(temperature=0.7, sampling_seed=7, max_new_tokens=64, ignore_eos=True))[1][0]["output_ids"]
              for _ in range(2)]
    assert seeded[0] == seeded[1] != greedy[0]


def test_a_stream_only_when_asked(servers):
    s = servers["random"]
    kind, answer = s.post(body(temperature=0, max_new_tokens=8, ignore_eos=True))
    assert kind == "application/json" and len(answer) == 1 and len(answer[0]["output_ids"]) == 8
    kind, chunks = s.post({**body(temperature=0, max_new_tokens=8, ignore_eos=True), "stream": True})
    assert kind == "text/event-stream" and steps(chunks) == list(range(1, 9))
    assert chunks[-1]["output_ids"] == answer[0]["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_lengths_follow_max_new_tokens_and_the_eos(servers):
    s = servers["random"]
    assert len(s.post(body(temperature=0, ignore_eos=True))[1][0]["output_ids"]) == 128  # SGLang's default
    full = s.post(body(temperature=0, max_new_tokens=400, ignore_eos=True))[1][0]
    assert len(full["output_ids"]) == 400 and full["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    cut = s.post(body(temperature=0, max_new_tokens=400))[1][0]  # the random target's EOS (id 0) comes up
    n = len(cut["output_ids"])
    assert n < 400 and cut["output_ids"] == full["output_ids"][:n] and cut["output_ids"][-1] == 0
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": 0}
    assert len(s.post(body(temperature=0, max_new_tokens=400, min_new_tokens=n + 1))[1][0]["output_ids"]) > n


def test_requests_sglang_refuses_are_refused(servers):
    for server, req, message in (
            ("random", body(max_tokens=8), "unexpected keyword argument 'max_tokens'"),
            ("random", {"text": "hello", "sampling_params": {}}, "--skip-tokenizer-init"),
            ("random", body(temperature=-1), "temperature must be non-negative"),
            ("random-DFLASH", body(regex="(yes|no)"), "DFLASH speculative decoding does not support "
                                                       "grammar-constrained decoding yet.")):
        with pytest.raises(urllib.error.HTTPError) as e:
            servers[server].post(req)
        assert e.value.code == 400 and message in json.loads(e.value.read())["error"]["message"]


def test_text_and_the_openai_routes_are_decoded_from_the_request(servers):
    s = servers["random-text"]
    _, a = s.post({"text": "hello", "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
    assert len(a[0]["output_ids"]) == 12 and isinstance(a[0]["text"], str)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    _, c = s.post(chat, "/v1/chat/completions")
    assert c[0]["object"] == "chat.completion" and c[0]["usage"]["completion_tokens"] <= 6
    kind, chunks = s.post({**chat, "stream": True}, "/v1/chat/completions")
    assert kind == "text/event-stream" and "".join(ch["choices"][0]["delta"]["content"] for ch in chunks) == \
        c[0]["choices"][0]["message"]["content"]
