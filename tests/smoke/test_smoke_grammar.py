"""The grammar phase of `dflashctl smoke` end to end, against recorded constrained answers.

The stand-in SGLang (tests/data/smoke/fake_sglang) answers constrained requests from the answers
SGLang 0.5.11 gave on an H200 to the same requests (tests/data/smoke/h200-grammar/baseline.json,
matched on path and body), and refuses them with SGLang's HTTP 400 when it runs speculative
decoding. Each test edits one answer and runs the real command: the real OpenAI client and the
real checks decide ok or fail.
"""

import json
import os

import pytest

from dflashctl import errors
from smoke_runner import FAKE, GRAMMAR, PYTHON_DIR, SGLANG_FACTS, prompts, smoke

ROWS = [("regex", "/generate"), ("ebnf", "/generate"), ("json_schema", "/generate"),
        ("structural_tag", "/generate"), ("json_schema", "openai client"), ("tool_call", "openai client")]


def server(result: dict, run: str) -> dict:
    return next(s for s in result["grammar"]["servers"] if s["run"] == run)


def answer(doc: dict, index: int, output: str) -> None:
    """Put `output` where the recorded answer `index` carries its output (SGLang returned the tool
    call as the message's content: no --tool-call-parser)."""
    rec = doc["grammar"][index]
    if rec["request"]["path"] == "/generate":
        rec["response"]["text"] = output
    else:
        rec["response"]["choices"][0]["message"]["content"] = output


def answers(tmp_path, edit=None):
    """A copy of the H200's grammar answers; `edit(doc)` may change them first."""
    doc = json.loads(GRAMMAR.read_text())
    if edit:
        edit(doc)
    out = tmp_path / "grammar.json"
    out.write_text(json.dumps(doc))
    return out


def run_grammar(tmp_path, edit=None, *args, faults=None, **env):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--json", "result.json", *args,
              grammar=answers(tmp_path, edit), faults=faults, **env)
    return p, json.loads((tmp_path / "result.json").read_text())


def test_every_constrained_output_is_checked_and_dflash_refusal_is_a_limit(tmp_path):
    p, result = run_grammar(tmp_path)
    assert p.returncode == 0, p.stderr
    g = result["grammar"]
    assert g["ok"] and g["failures"] == [] and result["ok"]
    base = server(result, "baseline")
    assert [(r["kind"], r["api"], r["status"]) for r in base["rows"]] == [(*r, "ok") for r in ROWS]
    assert [r["output"] for r in base["rows"]] == [  # what xgrammar gave the random target on the H200
        "yes, 390 pears", "bonjour world!", '{"ok": true, "color": "blue", "size": "M"}',
        '<call>{"city":"Tokyo"}</call>', '{"ok": true, "color": "blue", "size": "M"}',
        'get_weather({"city": "Berlin"})']
    # what the fake reports back is what smoke started it with
    assert (base["tokenizer"], base["grammar_backend"], base["json_whitespace"]) == (True, "xgrammar", "fixed")
    assert base["verdict"] == "serves structured output (xgrammar): 6/6 outputs match their grammars"
    dflash = server(result, "DFLASH")
    assert [(r["kind"], r["status"], r["http_status"]) for r in dflash["rows"]] == [("regex", "refused", 400)]
    assert "does not support grammar-constrained decoding" in dflash["rows"][0]["problem"]
    assert "a limit of SGLang 0.5.11 with DFLASH, not a failure of this host" in dflash["verdict"]
    assert g["tokenizer"]["vocab_size"] == 3000 and g["client"].startswith("openai ")
    table = p.stdout[p.stdout.index("grammar phase"):]
    assert "baseline  tool_call       openai client  ok  get_weather" in table
    assert "DFLASH    regex           /generate      refused  HTTP 400" in table


VIOLATIONS = [
    (0, "yes, 7334 apples", "does not fully match the regex"),
    (1, "bonjour Paris", "is not a sentence of the EBNF grammar"),
    # what a random model writes without --constrained-json-disable-any-whitespace, cut at max_new_tokens
    (2, '{"ok"\t\n\t\n \t:\t\n false\t\t\n,\n\t\t', "not JSON"),
    (3, '<call>{"city":"Rome"}</call>', "$.city: 'Rome' is not one of ['Paris', 'Berlin', 'Tokyo']"),
    (3, '{"city":"Paris"}', "is not wrapped in <call>...</call>"),
    (4, '{"ok": false, "color": "blue", "size": "L", "note": "x"}', "property 'note' is not allowed"),
    (4, '{"ok": 1, "color": "blue", "size": "L"}', "$.ok: 1 is not of type boolean"),
    (5, '[{"name": "get_weather", "parameters": {"city": "Rome"}}]',
     "arguments of get_weather: $.city: 'Rome' is not one of"),
    (5, '[{"name": "get_time", "parameters": {}}]', "unknown tool 'get_time'"),
]


@pytest.mark.parametrize("index, output, problem", VIOLATIONS,
                         ids=[f"{ROWS[i][0]}-{ROWS[i][1].split()[0].strip('/')}-{n}" for n, (i, _, _) in
                              enumerate(VIOLATIONS)])
def test_an_output_violating_its_grammar_fails_the_smoke(tmp_path, index, output, problem):
    p, result = run_grammar(tmp_path, lambda doc: answer(doc, index, output))
    assert p.returncode == errors.GRAMMAR_VIOLATION, p.stderr
    assert not result["ok"] and result["runs"][0]["ok"]  # the throughput phases passed
    kind, api = ROWS[index]
    assert len(result["failures"]) == 1 and result["failures"] == result["grammar"]["failures"]
    assert result["failures"][0].startswith(f"grammar: baseline {kind} via {api}: output violates its grammar: ")
    assert problem in result["failures"][0]
    rows = server(result, "baseline")["rows"]
    assert [r["status"] for r in rows] == ["violation" if i == index else "ok" for i in range(len(ROWS))]
    assert "VIOLATION" in p.stdout and f"FAILED: grammar: baseline {kind}" in p.stdout
    assert "\t" not in p.stdout  # a random model's tabs are shown escaped, on one line


def test_a_tool_call_answer_without_a_call_fails(tmp_path):
    def no_call(doc):
        message = doc["grammar"][5]["response"]["choices"][0]["message"]
        message["tool_calls"], message["content"] = None, '[{"name": "get_weather", "parameters": {"ci'
    p, result = run_grammar(tmp_path, no_call)
    assert p.returncode == errors.GRAMMAR_VIOLATION
    assert "no tool call in the answer" in result["failures"][0]


def test_a_constrained_request_refused_by_the_baseline_fails(tmp_path):
    """A non-speculative server with a tokenizer and a grammar backend must serve the request."""
    def refuse(doc):
        doc["grammar"][2].update(status=400, response={"error": {"message": "Failed to compile json grammar"}})
    p, result = run_grammar(tmp_path, refuse)
    assert p.returncode == errors.GRAMMAR_VIOLATION
    assert result["failures"] == ["grammar: baseline json_schema via /generate: request failed: "
                                  "HTTP 400: Failed to compile json grammar"]


def test_a_speculative_server_that_serves_constraints_is_checked_too(tmp_path):
    """A DFLASH server that answers constrained requests (a later SGLang may): its answers are
    checked like the baseline's."""
    served = [{"kind": "grammar-served", "server": "DFLASH"}]
    p, result = run_grammar(tmp_path, lambda doc: answer(doc, 0, "no, 5 pears"), faults=served)
    assert p.returncode == 0, p.stderr
    assert server(result, "DFLASH")["verdict"].startswith("serves structured output")
    p, result = run_grammar(tmp_path, lambda doc: answer(doc, 0, "no, five pears"), faults=served)
    assert p.returncode == errors.GRAMMAR_VIOLATION
    assert [f.split(":")[1] for f in result["failures"]] == [" baseline regex via /generate", " DFLASH regex via /generate"]
    assert result["failures"][1].startswith("grammar: DFLASH regex via /generate: output violates its grammar")


def test_a_throughput_failure_outranks_a_grammar_failure(tmp_path):
    p, result = run_grammar(tmp_path, lambda doc: answer(doc, 0, "maybe"),
                            faults=[{"kind": "empty", "server": "DFLASH", "prompt": prompts()[1]}])
    assert p.returncode == errors.FAILED
    assert len(result["grammar"]["failures"]) == 1
    # 2 phases x 1 empty response, DFLASH's outputs no longer the baseline's, the grammar violation
    assert len(result["failures"]) == 4 and len(result["lossless_failures"]) == 1


def test_a_service_without_a_tokenizer_is_reported_not_failed(tmp_path, running):
    """--skip-tokenizer-init switches SGLang's grammar backend off: nothing to check on the
    baseline; the DFLASH service gets its probe as token ids and refuses it."""
    base = running("baseline")  # started with --skip-tokenizer-init
    dflash = running("DFLASH")
    p = smoke(tmp_path, "--url", dflash, "--baseline-url", base, "--json", "result.json")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    b = server(result, "baseline")
    assert b["tokenizer"] is False and {r["status"] for r in b["rows"]} == {"skipped"}
    assert b["verdict"].startswith("not tested: no tokenizer (--skip-tokenizer-init)")
    assert server(result, "DFLASH")["rows"][0]["status"] == "refused"
    assert result["grammar"]["tokenizer"] is None


def test_a_service_with_grammar_backend_none_says_what_it_cannot_serve(tmp_path, running):
    url = running("baseline", args=("--grammar-backend", "none"))  # a tokenizer: it gets text prompts
    p = smoke(tmp_path, "--url", url, "--json", "result.json", "--runs", "baseline")
    assert p.returncode == 0, p.stderr
    verdict = server(json.loads((tmp_path / "result.json").read_text()), "baseline")["verdict"]
    assert verdict == ("cannot serve structured output: --grammar-backend none: JSON-schema, regex, EBNF, "
                       "structural-tag and tool-call requests are refused")


def test_without_the_openai_package_plain_http_is_used_and_said(tmp_path):
    shadow = tmp_path / "no-openai" / "openai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("No module named \'openai\' (test)")\n')
    path = os.pathsep.join([str(shadow.parent), str(PYTHON_DIR), str(FAKE), str(SGLANG_FACTS)])
    p, result = run_grammar(tmp_path, None, PYTHONPATH=path)
    assert p.returncode == 0, p.stderr
    rows = server(result, "baseline")["rows"]
    assert [(r["api"], r["status"]) for r in rows[4:]] == [("HTTP (no openai)", "ok")] * 2
    assert "the openai package is not installed" in result["grammar"]["client"]
    assert "the openai package is not installed" in p.stdout


def test_recorded_grammar_answers_can_serve_as_the_stand_ins(tmp_path):
    """What --record writes on a GPU can replace tests/data/smoke/h200-grammar as the answers."""
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--record", "rec", "--json", "first.json")
    assert p.returncode == 0, p.stderr
    rec = json.loads((tmp_path / "rec" / "baseline.json").read_text())["grammar"]
    assert [(r["kind"], r["status"]) for r in rec] == [(k, 200) for k, _ in ROWS]
    assert rec[5]["request"]["body"]["tool_choice"] == "required"
    dflash = json.loads((tmp_path / "rec" / "DFLASH.json").read_text())["grammar"]
    assert [(r["kind"], r["status"]) for r in dflash] == [("regex", 400)]
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--json", "second.json", grammar=tmp_path / "rec" / "baseline.json")
    assert p.returncode == 0, p.stderr
    first, second = (json.loads((tmp_path / f).read_text())["grammar"] for f in ("first.json", "second.json"))
    strip = lambda g: [[(r["kind"], r["status"], r["output"]) for r in s["rows"]] for s in g["servers"]]  # noqa: E731
    assert strip(first) == strip(second)
