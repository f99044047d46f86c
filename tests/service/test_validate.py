"""`dflashctl validate`: every malformed configuration is refused with a message naming the problem."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import cli, errors

OK = {"name": "a", "model": "Qwen/Qwen3-8B"}
DFLASH = {**OK, "draftModel": "z-lab/Qwen3-8B-DFlash-b16", "speculative": {"algorithm": "DFLASH"}}


def two(a: dict, b: dict) -> dict:
    return {"instances": {"a": {"model": "m", **a}, "b": {"model": "m", **b}}}


# (id, settings, a phrase the message must contain)
MALFORMED = [
    ("not-an-object", ["model"], "must be a JSON object"),
    ("model-missing", {"name": "a"}, "model: required"),
    ("model-empty", {**OK, "model": ""}, "model: must be a non-empty string"),
    ("model-number", {**OK, "model": 7}, "model: must be a non-empty string (got 7)"),
    ("typo-top-level", {**OK, "prot": 30001}, "prot: unknown setting (did you mean 'port'?)"),
    ("typo-camel-case", {**OK, "tp_size": 2}, "tp_size: unknown setting (did you mean 'tpSize'?)"),
    ("typo-speculative", {**DFLASH, "speculative": {"algorithm": "DFLASH", "numDraftToken": 8}},
     "speculative.numDraftToken: unknown setting (did you mean 'numDraftTokens'?)"),
    ("bad-name", {**OK, "name": "my model"}, "name: 'my model' must be 1-64 letters"),
    ("name-differs-from-key", {"instances": {"a": {"name": "b", "model": "m"}}},
     "name: 'b' differs from the instance's key 'a'"),
    ("algorithm-lowercase", {**DFLASH, "speculative": {"algorithm": "dflash"}},
     'speculative.algorithm: must be one of "DFLASH", "DDTREE", "EAGLE3" (got "dflash")'),
    ("algorithm-unknown", {**DFLASH, "speculative": {"algorithm": "MEDUSA"}}, '(got "MEDUSA")'),
    ("speculative-not-object", {**OK, "speculative": "DFLASH"}, "speculative: must be an object"),
    ("dflash-without-draft", {**OK, "speculative": {"algorithm": "DFLASH"}},
     "speculative.algorithm: DFLASH needs draftModel"),
    ("ddtree-without-draft", {**OK, "speculative": {"algorithm": "DDTREE"}},
     "speculative.algorithm: DDTREE needs draftModel"),
    ("eagle3-without-draft", {**OK, "speculative": {"algorithm": "EAGLE3"}},
     "speculative.algorithm: EAGLE3 needs draftModel"),
    ("draft-without-algorithm", {**OK, "draftModel": "z-lab/x"},
     "draftModel: set, but speculative.algorithm is null"),
    ("draft-tokens-without-algorithm", {**OK, "speculative": {"numDraftTokens": 8}},
     "speculative.numDraftTokens: set, but speculative.algorithm is null"),
    ("budget-with-dflash", {**DFLASH, "speculative": {"algorithm": "DFLASH", "ddtreeBudget": 64}},
     "speculative.ddtreeBudget: only DDTREE uses a tree budget, not DFLASH"),
    ("draft-tokens-zero", {**DFLASH, "speculative": {"algorithm": "DFLASH", "numDraftTokens": 0}},
     "speculative.numDraftTokens: must be an integer from 1 to 1024 (got 0)"),
    ("draft-tokens-string", {**DFLASH, "speculative": {"algorithm": "DFLASH", "numDraftTokens": "16"}},
     'speculative.numDraftTokens: must be an integer from 1 to 1024 (got "16")'),
    ("port-zero", {**OK, "port": 0}, "port: must be an integer from 1 to 65535 (got 0)"),
    ("port-too-big", {**OK, "port": 70000}, "port: must be an integer from 1 to 65535 (got 70000)"),
    ("port-string", {**OK, "port": "30000"}, 'port: must be an integer from 1 to 65535 (got "30000")'),
    ("port-bool", {**OK, "port": True}, "port: must be an integer from 1 to 65535 (got true)"),
    ("port-above-grpc-range", {**OK, "port": 59125},
     "port: 59125 is above 55535: SGLang 0.5.11 derives its gRPC port as port + 10000"),
    ("tp-zero", {**OK, "tpSize": 0}, "tpSize: must be an integer from 1 to 64 (got 0)"),
    ("tp-larger-than-gpus", {**OK, "gpus": [0], "tpSize": 2},
     "tpSize: 2 is larger than the 1 GPU(s) given in gpus [0]"),
    ("gpus-not-list", {**OK, "gpus": "0,1"}, "gpus: must be a list of GPU indices"),
    ("gpus-negative", {**OK, "gpus": [-1]}, "gpus: must be a list of GPU indices"),
    ("gpus-repeated", {**OK, "gpus": [1, 1]}, "gpus: must be a list without repeats (got [1, 1])"),
    ("grammar-unknown", {**OK, "grammarBackend": "xgrammer"},
     'grammarBackend: must be one of "xgrammar", "llguidance", "outlines", "none" (got "xgrammer")'),
    ("grammar-null", {**OK, "grammarBackend": None}, "grammarBackend: must be one of"),
    ("json-whitespace-string", {**OK, "constrainedJsonDisableAnyWhitespace": "yes"},
     'constrainedJsonDisableAnyWhitespace: must be true or false (got "yes")'),
    ("json-whitespace-in-extra-args", {**OK, "extraArgs": ["--constrained-json-disable-any-whitespace"]},
     "extraArgs: --constrained-json-disable-any-whitespace is set by the option "
     "constrainedJsonDisableAnyWhitespace"),
    ("mem-fraction-above-one", {**OK, "memFractionStatic": 1.5},
     "memFractionStatic: must be a number greater than 0 and at most 1 (got 1.5)"),
    ("mem-fraction-zero", {**OK, "memFractionStatic": 0}, "memFractionStatic: must be a number greater than 0"),
    ("context-negative", {**OK, "contextLength": -4096}, "contextLength: must be an integer >= 1"),
    ("api-key-relative", {**OK, "apiKeyFile": "secrets/key"}, "apiKeyFile: must be an absolute path"),
    ("cache-dir-relative", {**OK, "cacheDir": "cache"}, "cacheDir: must be an absolute path"),
    ("metrics-string", {**OK, "enableMetrics": "yes"}, 'enableMetrics: must be true or false (got "yes")'),
    ("shared-gpus-number", {**OK, "allowSharedGpus": 1}, "allowSharedGpus: must be true or false"),
    ("env-not-object", {**OK, "environment": ["A=1"]}, "environment: must be an object of strings"),
    ("env-number-value", {**OK, "environment": {"NCCL_P2P_LEVEL": 5}},
     "environment: must be an object of strings (NCCL_P2P_LEVEL is 5; quote it)"),
    ("env-bad-name", {**OK, "environment": {"MY-VAR": "1"}},
     "environment: must be an object whose keys are variable names ('MY-VAR' is not)"),
    ("env-cuda-devices-and-gpus", {**OK, "gpus": [0], "environment": {"CUDA_VISIBLE_DEVICES": "1"}},
     "environment.CUDA_VISIBLE_DEVICES: conflicts with gpus"),
    ("extra-args-string", {**OK, "extraArgs": "--max-running-requests 64"},
     "extraArgs: must be a list of strings"),
    ("extra-args-repeat-port", {**OK, "extraArgs": ["--port", "1"]},
     "extraArgs: --port is set by the option port; use that option"),
    ("extra-args-repeat-grammar", {**OK, "extraArgs": ["--grammar-backend=none"]},
     "extraArgs: --grammar-backend is set by the option grammarBackend"),
    ("start-timeout-zero", {**OK, "startTimeoutSec": 0}, "startTimeoutSec: must be an integer from 1 to 86400"),
    ("stall-timeout-negative", {**OK, "stallTimeoutSec": -1}, "stallTimeoutSec: must be an integer from 0 to 86400"),
    ("cuda-graph-bs-zero", {**OK, "cudaGraphMaxBs": 0}, "cudaGraphMaxBs: must be an integer >= 1"),
    ("two-instances-one-port", two({"port": 30000, "gpus": [0]}, {"port": 30000, "gpus": [1]}),
     "instances 'a' and 'b': both use port 30000"),
    ("wildcard-host-same-port", two({"host": "0.0.0.0", "gpus": [0]}, {"host": "127.0.0.1", "gpus": [1]}),
     "both use port 30000"),
    ("one-gpu-two-instances", two({"port": 1, "gpus": [0, 1]}, {"port": 2, "gpus": [1, 2]}),
     "instances 'a' and 'b': both use GPU 1; give them disjoint gpus, or set allowSharedGpus = true on both"),
    ("all-gpus-and-one-gpu", two({"port": 1}, {"port": 2, "gpus": [3]}),
     "both use every GPU (one of them leaves gpus empty)"),
    ("shared-allowed-on-one-only", two({"port": 1, "gpus": [0], "allowSharedGpus": True},
                                       {"port": 2, "gpus": [0]}), "both use GPU 0"),
    ("instances-not-object", {"instances": ["a"]}, 'must hold only {"instances"'),
    ("instances-extra-key", {"instances": {}, "version": 1}, 'must hold only {"instances"'),
]


def run_validate(tmp_path: Path, data, *extra: str, capsys=None) -> tuple[int, str]:
    f = tmp_path / "settings.json"
    f.write_text(json.dumps(data))
    rc = cli.main(["validate", str(f), *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize("data,message", [(d, m) for _, d, m in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_is_refused_with_its_message(tmp_path, capsys, data, message):
    rc, text = run_validate(tmp_path, data, capsys=capsys)
    assert rc == errors.CONFIG
    assert message in text
    assert "Traceback" not in text


def test_a_repeated_gpu_is_reported_once(tmp_path, capsys):
    """Issue 9 #11: the message said `(got [0, 0]) (got [0, 0])`."""
    rc, text = run_validate(tmp_path, {**OK, "gpus": [0, 0]}, capsys=capsys)
    assert rc == errors.CONFIG
    assert text.count("(got [0, 0])") == 1


INJECTION = "x\nExecStartPre=+/bin/sh -c 'id'"
# Every string setting, at every depth, and the names of environment variables.
CONTROL_CASES = [
    ("model", {**OK, "model": INJECTION}),
    ("draftModel", {**DFLASH, "draftModel": INJECTION}),
    ("host", {**OK, "host": INJECTION}),
    ("attentionBackend", {**OK, "attentionBackend": INJECTION}),
    ("servedModelName", {**OK, "servedModelName": INJECTION}),
    ("apiKeyFile", {**OK, "apiKeyFile": "/run/k" + INJECTION}),
    ("cacheDir", {**OK, "cacheDir": "/var/cache/hf" + INJECTION}),
    ("loadFormat", {**OK, "loadFormat": "dummy\t"}),
    ("draftLoadFormat", {**DFLASH, "draftLoadFormat": "\x7f"}),
    ("samplingBackend", {**OK, "samplingBackend": "a\rb"}),
    ("extraArgs[1]", {**OK, "extraArgs": ["--max-running-requests", "6\n4"]}),
    ("environment.NCCL_DEBUG", {**OK, "environment": {"NCCL_DEBUG": "WARN\nX=1"}}),
    ("speculative.draftAttentionBackend",
     {**DFLASH, "speculative": {"algorithm": "DFLASH", "draftAttentionBackend": "fa3\x00"}}),
]


@pytest.mark.parametrize("key,data", CONTROL_CASES, ids=[k for k, _ in CONTROL_CASES])
def test_control_characters_are_refused_in_every_setting(tmp_path, capsys, key, data):
    """Issue 9 #1: validate accepted a newline that injected a root ExecStartPre into the unit."""
    rc, text = run_validate(tmp_path, data, capsys=capsys)
    assert rc == errors.CONFIG
    assert f"{key}: contains the control character U+" in text


def test_there_are_at_least_30_cases():
    assert len(MALFORMED) >= 30
    assert len({i for i, _, _ in MALFORMED}) == len(MALFORMED)


def test_every_problem_is_listed_at_once(tmp_path, capsys):
    rc, text = run_validate(tmp_path, {"name": "a", "port": 0, "tpSize": 0, "prot": 1}, capsys=capsys)
    assert rc == errors.CONFIG
    for phrase in ("model: required", "port: must be", "tpSize: must be", "prot: unknown setting"):
        assert phrase in text
    assert "4 problem(s)" in text


@pytest.mark.parametrize("data", [
    OK,
    DFLASH,
    {**DFLASH, "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "fa3"},
     "gpus": [0, 1], "tpSize": 2, "environment": {"NCCL_DEBUG": "WARN"}, "extraArgs": ["--max-running-requests", "8"]},
    two({"port": 1, "gpus": [0]}, {"port": 2, "gpus": [1]}),
    two({"port": 1, "gpus": [0], "allowSharedGpus": True, "memFractionStatic": 0.4},
        {"port": 2, "gpus": [0], "allowSharedGpus": True, "memFractionStatic": 0.4}),
    two({"port": 1, "host": "10.0.0.1", "gpus": [0]}, {"port": 1, "host": "10.0.0.2", "gpus": [1]}),
    {**OK, "port": 60000, "environment": {"SGLANG_GRPC_PORT": "40000"}},
], ids=["minimal", "dflash", "full", "two-disjoint", "two-shared-allowed", "same-port-other-address",
        "high-port-with-grpc-port"])
def test_valid_settings_pass(tmp_path, capsys, data):
    rc, text = run_validate(tmp_path, data, capsys=capsys)
    assert rc == 0, text
    assert "valid" in text


def test_grammar_none_is_allowed_with_a_warning(tmp_path, capsys):
    rc, text = run_validate(tmp_path, {**OK, "grammarBackend": "none"}, capsys=capsys)
    assert rc == 0
    # what stops working, and the evidence that the locked xgrammar works
    assert "warning" in text and "cannot serve structured output" in text
    assert "JSON-schema, regex, EBNF, structural-tag and tool-call request (HTTP 400)" in text
    assert "`dflashctl smoke`" in text
    rc, text = run_validate(tmp_path, OK, capsys=capsys)
    assert "grammarBackend" not in text


def test_json_output(tmp_path, capsys):
    rc, text = run_validate(tmp_path, {**OK, "port": 0}, "--json", capsys=capsys)
    assert rc == errors.CONFIG
    result = json.loads(text[:text.index("\n}") + 2])
    assert result["ok"] is False
    assert any("port: must be" in e for e in result["errors"])


def test_unreadable_and_broken_json(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "missing.json")]) == errors.CONFIG
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "m",}')
    assert cli.main(["validate", str(bad)]) == errors.CONFIG
    assert "not valid JSON" in capsys.readouterr().err


# --- the package's SGLang: algorithms read from a real (stand-in) sglang source tree --------------

def fake_stack(tmp_path: Path, choices: list[str] | None) -> str:
    """An interpreter whose `sglang` is a source tree with the given --speculative-algorithm choices."""
    site = tmp_path / "site"
    if choices is not None:
        srt = site / "sglang" / "srt"
        srt.mkdir(parents=True)
        (site / "sglang" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
        (srt / "__init__.py").write_text("")
        (srt / "server_args.py").write_text(
            "import argparse\nSPEC_CHOICES = " + json.dumps(choices) + "\n"
            "def add(parser):\n"
            "    parser.add_argument('--speculative-algorithm', type=str, choices=SPEC_CHOICES)\n")
    else:
        site.mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_ddtree_with_an_sglang_that_lacks_it(tmp_path, capsys):
    python = fake_stack(tmp_path, ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"])
    data = {**DFLASH, "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 64}}
    rc, text = run_validate(tmp_path, data, "--python", python, capsys=capsys)
    assert rc == errors.CONFIG
    assert "speculative.algorithm DDTREE is not offered by the package's SGLang" in text
    assert "DDTree patch" in text


def test_ddtree_with_a_patched_sglang(tmp_path, capsys):
    python = fake_stack(tmp_path, ["EAGLE", "EAGLE3", "DFLASH", "DDTREE"])
    data = {**DFLASH, "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 64}}
    rc, text = run_validate(tmp_path, data, "--python", python, capsys=capsys)
    assert rc == 0, text


def test_speculative_with_a_package_without_sglang(tmp_path, capsys):
    rc, text = run_validate(tmp_path, DFLASH, "--python", fake_stack(tmp_path, None), capsys=capsys)
    assert rc == errors.CONFIG
    assert "has no sglang" in text


def test_sglang_features_reads_choices_without_importing(tmp_path):
    from dflashctl.service import sglang_features
    python = fake_stack(tmp_path, ["DFLASH", "EAGLE3"])
    assert sglang_features.speculative_algorithms(python) == {"DFLASH", "EAGLE3"}
    assert sglang_features.speculative_algorithms(fake_stack(tmp_path / "x", None)) == set()


def test_cli_exit_code_in_a_real_process(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({**OK, "port": "x"}))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent.parent / "python"))
    r = subprocess.run([sys.executable, "-m", "dflashctl", "validate", str(f)], capture_output=True,
                       text=True, env=env)
    assert r.returncode == errors.CONFIG
    assert r.stderr.startswith("dflashctl validate: ")
    assert "Traceback" not in r.stderr


# ------------------------------------------------- input that used to end in a traceback (issue 15)

def run_cli_on_bytes(tmp_path: Path, data: bytes, command: str, capsys) -> tuple[int, str]:
    f = tmp_path / "settings.json"
    f.write_bytes(data)
    argv = ["validate", str(f)] if command == "validate" else ["unit", "--config", str(f), "--dflashctl", "/x"]
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


UNREADABLE = [
    ("invalid-utf8", b'{"name": "a", "model": "\xff\xfe"}', "is not UTF-8 text: byte 24: invalid start byte"),
    ("deep-nesting", b'{"name": "a", "model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "is not a valid settings file: its JSON is nested too deeply"),
    ("duplicate-key", b'{"name": "a", "model": "m", "port": 1, "port": 30000}',
     'is ambiguous: the key "port" appears twice in one object'),
    ("50-MB-model", b'{"name": "a", "model": "' + b"m" * 50_000_000 + b'"}',
     "is too large for a settings file"),
]


@pytest.mark.parametrize("command", ["validate", "unit"])
@pytest.mark.parametrize("data,message", [(d, m) for _, d, m in UNREADABLE], ids=[i for i, _, _ in UNREADABLE])
def test_unreadable_settings_are_one_config_error(tmp_path, capsys, command, data, message):
    rc, text = run_cli_on_bytes(tmp_path, data, command, capsys)
    assert rc == errors.CONFIG
    assert message in text
    assert "Traceback" not in text and len(text) < 1000


def test_a_trailing_newline_in_the_name_is_refused(tmp_path, capsys):
    rc, text = run_validate(tmp_path, {**OK, "name": "a\n"}, capsys=capsys)
    assert rc == errors.CONFIG
    assert "name: 'a\\n' must be 1-64 letters" in text


@pytest.mark.parametrize("key,value", [("model", "m" * 5000), ("draftModel", "d" * 5000),
                                       ("cacheDir", "/" + "c" * 5000)])
def test_text_that_systemd_or_argv_would_refuse_is_refused_here(tmp_path, capsys, key, value):
    data = {**DFLASH, key: value}
    rc, text = run_validate(tmp_path, data, capsys=capsys)
    assert rc == errors.CONFIG
    assert f"{key}: must be at most 4096 characters long (it has {len(value)})" in text
    assert len(text) < 1000  # the value is cut short in the message


def test_environment_and_extra_args_have_limits(tmp_path, capsys):
    rc, text = run_validate(tmp_path, {**OK, "environment": {"X": "v" * 5000},
                                       "extraArgs": ["--x"] * 300}, capsys=capsys)
    assert rc == errors.CONFIG
    assert "environment: must be an object of strings of at most 4096 characters (X has 5000)" in text
    assert "extraArgs: must be a list of at most 256 strings" in text


@pytest.mark.parametrize("gpus", [[0, 1, 0], [0, 0]])
def test_a_repeated_gpu_is_named_once(tmp_path, capsys, gpus):
    rc, text = run_validate(tmp_path, {**OK, "gpus": gpus}, capsys=capsys)
    assert rc == errors.CONFIG
    assert f"gpus: must be a list without repeats (got {json.dumps(gpus)})" in text
    assert text.count("(got") == 1


@pytest.mark.parametrize("fractions, stuck", [
    ((0.2, 0.5), ["a"]),  # the H200 run: b (0.5) came back after a kill; a (0.2) could not
    ((0.25, 0.25), ["a", "b"]),  # neither restarts while the other runs
    ((0.3, None), ["a"]),  # b at SGLang's default (about 0.9) comes back; a does not
])
def test_instances_sharing_a_gpu_are_told_which_cannot_restart(fractions, stuck):
    from dflashctl.service import validate
    instances = {name: {"model": "m", "gpus": [0], "allowSharedGpus": True, "port": 30000 + i,
                        **({"memFractionStatic": f} if f else {})}
                 for i, (name, f) in enumerate(zip("ab", fractions))}
    errors_, warnings, _ = validate.check({"instances": instances})
    assert not errors_
    named = sorted(w.split("'")[1] for w in warnings if "shares GPU 0" in w)
    assert named == stuck, warnings
    assert all("never while they run" in w and "exit 87" in w for w in warnings if "shares GPU" in w)
