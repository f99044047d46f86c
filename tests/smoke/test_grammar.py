"""The grammar phase's own checks (dflashctl/smoke/grammar.py, smoke/schema.py): data in, verdict out.

The outputs marked "xgrammar" are what xgrammar 0.1.32 let a random-logit model write under each
grammar with the synthetic tokenizer (checked while writing this; the H200 run records SGLang's).
"""

import json
from pathlib import Path

import pytest

from dflashctl.smoke import grammar, schema

XGRAMMAR_OUTPUTS = {  # kind -> outputs xgrammar accepted
    "regex": ["yes, 733 apples", "no, 585 pears", "no, 2 apples"],
    "ebnf": ["bonjour Paris!", "hello world!", "hello Berlin!"],
    "json_schema": ['{"ok": false, "color": "green", "size": "L"}', '{"ok":true,"color":"red","size":"S"}',
                    # any whitespace (without --constrained-json-disable-any-whitespace), when it ends
                    '{"ok"\t\t\n: true \n\t\t\t,\t\t\n"color"\t:\n  "green",\n\t \t"size":\t  "L"}'],
    "structural_tag": ['<call>{"city":"Paris"}</call>', '<call>{"city":"Berlin"}</call>'],
}
VIOLATING = {
    "regex": ["yes, 7334 apples", "yes, 7 apples ", "Yes, 7 apples", "yes,7 apples", ""],
    "ebnf": ["bonjour Paris", "hello  world!", "hi Paris!", "hello Paris!!"],
    "json_schema": ['{"ok": false, "color": "green"}', '{"ok": "false", "color": "green", "size": "L"}',
                    '{"ok": false, "color": "pink", "size": "L"}', '{"ok": false, "color": "red", "size": "L", "x": 1}',
                    '{"ok"\t\n\t\n :', "[]", "null"],
    "structural_tag": ['{"city":"Paris"}', '<call>{"city":"Rome"}</call>', '<call>{"city":"Paris"}',
                       '<call>{"city":"Paris"}</call> ', '<call></call>', '<call>{"city":"Paris","x":1}</call>'],
}


@pytest.mark.parametrize("kind, text", [(k, t) for k, ts in XGRAMMAR_OUTPUTS.items() for t in ts])
def test_outputs_of_the_grammar_pass(kind, text):
    assert grammar.text_problem(kind, text) is None


@pytest.mark.parametrize("kind, text", [(k, t) for k, ts in VIOLATING.items() for t in ts])
def test_outputs_outside_the_grammar_fail(kind, text):
    assert grammar.text_problem(kind, text)


def test_ebnf_and_its_checking_regex_name_the_same_sentences():
    """EBNF_LANGUAGE stands in for EBNF when checking: both list the same alternatives."""
    rules = dict(line.split(" ::= ") for line in grammar.EBNF.splitlines())
    alternatives = {name: [a.strip().strip('"') for a in rule.split("|")] for name, rule in rules.items()
                    if name != "root"}
    assert rules["root"] == 'greeting " " place "!"'
    expected = f"({'|'.join(alternatives['greeting'])}) ({'|'.join(alternatives['place'])})!"
    assert grammar.EBNF_LANGUAGE == expected


def test_structural_tag_is_xgrammars_format_form():
    tag = grammar.STRUCTURAL_TAG
    assert tag["type"] == "structural_tag" and tag["format"]["type"] == "tag"
    assert (tag["format"]["begin"], tag["format"]["end"]) == ("<call>", "</call>")
    kinds = [e["type"] for e in tag["format"]["content"]["elements"]]
    assert kinds == ["const_string", "json_schema", "const_string"]


def test_the_requests_are_those_sglang_answered_on_the_h200():
    """Each constrained request, body for body (the model name aside), as the grammar phase sent it
    on the H200 (tests/data/smoke/h200-grammar): the stand-in answers only these."""
    recorded = json.loads((Path(__file__).parent.parent / "data" / "smoke" / "h200-grammar" / "baseline.json").read_text())
    bodies = [(g["request"]["path"], {k: v for k, v in g["request"]["body"].items() if k != "model"})
              for g in recorded["grammar"]]
    ours = [("/generate", grammar.generate_body(c)) if c.api == "generate" else
            ("/v1/chat/completions", {k: v for k, v in grammar.chat_body(c, "m").items() if k != "model"})
            for c in grammar.CASES]
    assert ours == bodies


def test_requests_carry_one_constraint_each():
    for case in grammar.CASES:
        if case.api == "generate":
            params = grammar.generate_body(case)["sampling_params"]
            assert [k for k in grammar.CONSTRAINT_KEYS if k in params] == [case.kind]
            assert "ignore_eos" not in params  # the grammar's end must be able to stop the output
        else:
            body = grammar.chat_body(case, "m")
            assert ("response_format" in body) != ("tools" in body)
    probe = grammar.generate_body(grammar.PROBE, grammar.PROBE_IDS)
    assert probe["input_ids"] == grammar.PROBE_IDS and "text" not in probe


def chat(content=None, tool_calls=None) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}]}


def call(name, arguments) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL = grammar.CASES[5]


@pytest.mark.parametrize("response, problem", [
    (chat(tool_calls=[call("get_weather", '{"city": "Paris"}')]), None),
    (chat(tool_calls=[call("get_time", '{"city": "Paris"}')]), "unknown tool 'get_time'"),
    (chat(tool_calls=[call("get_weather", '{"city": "Rome"}')]), "$.city: 'Rome' is not one of"),
    (chat(tool_calls=[call("get_weather", '{"city": "Paris"}')] * 2), "2 calls, but parallel_tool_calls was false"),
    (chat(content='[{"name": "get_weather", "param'), "no tool call in the answer"),
    # SGLang 0.5.11 without a tool-call parser: the constrained array as content (H200, 2026-11-30)
    (chat(content='[{"name": "get_weather", "parameters": {"city": "Paris"}}]<|endoftext|>'), None),
    (chat(content='[{"name": "get_weather", "parameters": {"city": "Rome"}}]'), "$.city: 'Rome' is not one of"),
    (chat(content='{"name": "get_weather", "parameters": {"city": "Paris"}}'), "no tool call in the answer"),
    (chat(), "no tool call in the answer"),
])
def test_tool_call_answers(response, problem):
    shown, found = grammar.output_of(TOOL, response)
    assert (found is None) if problem is None else (problem in found)
    if problem is None:
        assert shown == 'get_weather({"city": "Paris"})'


def test_generate_answer_without_text_is_a_violation():
    shown, problem = grammar.output_of(grammar.CASES[0], {"output_ids": [1, 2], "meta_info": {}})
    assert shown == "(no text)" and "no text" in problem


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]},
                                          "c": {"type": "array", "items": {"$ref": "#/$defs/item"},
                                                "minItems": 1, "maxItems": 2}},
          "required": ["a"], "additionalProperties": {"type": "boolean"},
          "$defs": {"item": {"anyOf": [{"const": 1}, {"type": "string", "enum": ["x"]}]}}}


@pytest.mark.parametrize("value, problems", [
    ({"a": 1}, []),
    ({"a": 1, "b": None, "c": [1, "x"], "z": True}, []),
    ({"a": True}, ["$.a: True is not of type integer"]),
    ({"a": 1.5}, ["$.a: 1.5 is not of type integer"]),
    ({}, ["$: required property 'a' is missing"]),
    ({"a": 1, "z": 3}, ["$.z: 3 is not of type boolean"]),
    ({"a": 1, "c": []}, ["$.c: 0 items, fewer than minItems 1"]),
    ({"a": 1, "c": [1, 1, 1]}, ["$.c: 3 items, more than maxItems 2"]),
    ({"a": 1, "c": [True]}, ["$.c[0]: True matches none of anyOf"]),  # true is not 1
    ({"a": 1, "c": ["y"]}, ["$.c[0]: 'y' matches none of anyOf"]),
    ([], ["$: [] is not of type object"]),
])
def test_schema_subset(value, problems):
    assert schema.problems(value, SCHEMA) == problems


def test_schema_keywords_outside_the_subset_are_reported_not_passed():
    assert schema.problems("abc", {"type": "string", "maxLength": 2}) == [
        "$: unsupported schema keyword 'maxLength'"]
    assert schema.problems(1, {"$ref": "https://example.invalid/s.json"})[0].startswith("$: unsupported $ref")


def test_the_tool_call_schema_sglang_builds_is_in_the_subset():
    """SGLang 0.5.11 constrains tool_choice=required with this schema (function_call/utils.py)."""
    sglang_schema = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": grammar.CITY_SCHEMA},
         "required": ["name", "parameters"]}]}}
    assert schema.problems(json.loads('[{"name": "get_weather", "parameters": {"city": "Berlin"}}]'),
                           sglang_schema) == []
    assert schema.problems([{"name": "get_weather", "parameters": {}}], sglang_schema)


def test_table_shows_the_failing_output_on_one_line():
    sg = grammar.ServerGrammar("baseline", None, "0.5.11", True, "xgrammar", "any", client="openai 2.6.1")
    sg.rows = [grammar.Row("regex", "/generate", "ok", output="no, 5 pears"),
               grammar.Row("json_schema", "/generate", "violation", output='{"ok"\t\n\t\n :',
                           problem="not JSON (Expecting value at character 12)")]
    sg.verdict = grammar._verdict(sg)
    block = grammar.summary([sg], None)
    text = grammar.table(block)
    assert "baseline  json_schema  /generate  VIOLATION  not JSON (Expecting value at character 12); " \
           "output: {\"ok\"\\t\\n\\t\\n :" in text
    assert "baseline: FAILED: 1 output(s) violate their grammar, 0 request(s) failed, of 2" in text
    assert block["failures"] == ["grammar: baseline json_schema via /generate: output violates its grammar: "
                                 "not JSON (Expecting value at character 12) (output: {\"ok\"\\t\\n\\t\\n :)"]
