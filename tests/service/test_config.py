"""service/config.py on its own: every checker and rule of one instance's settings, with the exact
problem lines `validate`, `serve` and the module's build-time check print (tests/service/test_validate.py
runs the same rules through the command)."""

import json

import pytest

from dflashctl import errors
from dflashctl.service import config, settings_schema

OK = {"name": "a", "model": "Qwen/Qwen3-8B"}
D = {**OK, "draftModel": "z-lab/d", "speculative": {"algorithm": "DFLASH"}}
long = "m" * 4097

# (id, settings, every problem, in order; [] when the settings are valid)
CASES = [
    ("string-blank", {**OK, "model": "   "},
     ["model: must be a non-empty string (got \"   \")"]),
    ("string-long", {**OK, "model": long},
     ["model: must be at most 4096 characters long (it has 4097) (got \"mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm… (4099 characters))"]),
    ("string-4096", {**OK, "model": "m" * 4096},
     []),
    ("opt-null", {**OK, "draftModel": None},
     []),
    ("bool-one", {**OK, "offline": 1},
     ["offline: must be true or false (got 1)"]),
    ("int-bool", {**OK, "tpSize": True},
     ["tpSize: must be an integer from 1 to 64 (got true)"]),
    ("int-float", {**OK, "tpSize": 2.0},
     ["tpSize: must be an integer from 1 to 64 (got 2.0)"]),
    ("int-top", {**OK, "tpSize": 65},
     ["tpSize: must be an integer from 1 to 64 (got 65)"]),
    ("int-edges", {**OK, "tpSize": 64, "gpus": list(range(64)), "port": 1, "startTimeoutSec": 86400, "stallTimeoutSec": 0},
     []),
    ("int-no-top", {**OK, "contextLength": 0},
     ["contextLength: must be an integer >= 1 (got 0)"]),
    ("int-no-top-big", {**OK, "contextLength": 10**9},
     []),
    ("choice", {**OK, "grammarBackend": "x"},
     ["grammarBackend: must be one of \"xgrammar\", \"llguidance\", \"outlines\", \"none\" (got \"x\")"]),
    ("fraction-one", {**OK, "memFractionStatic": 1},
     []),
    ("fraction-above", {**OK, "memFractionStatic": 1.0001},
     ["memFractionStatic: must be a number greater than 0 and at most 1 (got 1.0001)"]),
    ("fraction-bool", {**OK, "memFractionStatic": True},
     ["memFractionStatic: must be a number greater than 0 and at most 1 (got true)"]),
    ("fraction-string", {**OK, "memFractionStatic": "0.5"},
     ["memFractionStatic: must be a number greater than 0 and at most 1 (got \"0.5\")"]),
    ("path-long", {**OK, "cacheDir": "/" + "c" * 4096},
     ["cacheDir: must be at most 4096 characters long (it has 4097) (got \"/cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc… (4099 characters))"]),
    ("path-number", {**OK, "hfTokenFile": 3},
     ["hfTokenFile: must be an absolute path (got 3)"]),
    ("revision-ok", {**OK, "modelRevision": "v1.0/x_y-z"},
     []),
    ("revision-dots", {**OK, "modelRevision": "a..b"},
     ["modelRevision: must be a commit hash (40 hex digits) or a branch/tag name (got \"a..b\")"]),
    ("revision-dash", {**OK, "modelRevision": "-x"},
     ["modelRevision: must be a commit hash (40 hex digits) or a branch/tag name (got \"-x\")"]),
    ("revision-long", {**OK, "modelRevision": "a" * 256},
     ["modelRevision: must be a commit hash (40 hex digits) or a branch/tag name (got \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa… (258 characters))"]),
    ("revision-number", {**OK, "modelRevision": 7},
     ["modelRevision: must be a commit hash (40 hex digits) or a branch/tag name (got 7)"]),
    ("gpus-bool", {**OK, "gpus": [0, True]},
     ["gpus: must be a list of GPU indices (integers >= 0), e.g. [0, 1] (got [0, true])"]),
    ("gpus-string", {**OK, "gpus": "0"},
     ["gpus: must be a list of GPU indices (integers >= 0), e.g. [0, 1] (got \"0\")"]),
    ("env-many", {**OK, "environment": {f"V{i}": "x" for i in range(257)}},
     ["environment: must be an object of at most 256 variables (got {\"V0\": \"x\", \"V1\": \"x\", \"V2\": \"x\", \"V3\": \"x\", \"V4\": \"x\", \"V5\": \"x\", \"V6\": \"x\", \"V… (3231 characters))"]),
    ("env-long-name", {**OK, "environment": {"A" * 4097: "x"}},
     ["environment: must be an object whose keys are variable names ('AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA… (4099 characters) is not) (got {\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA… (4106 characters))"]),
    ("env-long-value", {**OK, "environment": {"A": "x" * 4097}},
     ["environment: must be an object of strings of at most 4096 characters (A has 4097) (got {\"A\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx… (4106 characters))"]),
    ("env-256", {**OK, "environment": {f"V{i}": "x" * 4096 for i in range(256)}},
     []),
    ("extra-item", {**OK, "extraArgs": ["--x", 1]},
     ["extraArgs: must be a list of strings, e.g. [\"--max-running-requests\", \"64\"] (got [\"--x\", 1])"]),
    ("extra-many", {**OK, "extraArgs": ["--x"] * 257},
     ["extraArgs: must be a list of at most 256 strings of at most 4096 characters each (got [\"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"--x\", \"-… (1799 characters))"]),
    ("extra-long", {**OK, "extraArgs": ["x" * 4097]},
     ["extraArgs: must be a list of at most 256 strings of at most 4096 characters each (got [\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx… (4101 characters))"]),
    ("extra-256", {**OK, "extraArgs": ["x" * 4096] * 256},
     []),
    ("speculative-list", {**OK, "speculative": ["DFLASH"]},
     ["speculative: must be an object, e.g. {\"algorithm\": \"DFLASH\"} (got [\"DFLASH\"])"]),
    ("speculative-null", {**OK, "speculative": None},
     []),
    ("unknown-far", {**OK, "zzz": 1},
     ["zzz: unknown setting"]),
    ("unknown-speculative-far", {**OK, "speculative": {"qqq": 1}},
     ["speculative.qqq: unknown setting"]),
    ("control-env-name", {**OK, "environment": {"A\n": "x"}},
     ["environment.A\n (the name): contains the control character U+000A (a newline, tab, NUL or similar would end or corrupt a line of the systemd unit); remove it (got \"A\\n\")", "environment: must be an object whose keys are variable names ('A\\n' is not) (got {\"A\\n\": \"x\"})"]),
    ("control-list", {**OK, "extraArgs": ["ok", "a\x00b"]},
     ["extraArgs[1]: contains the control character U+0000 (a newline, tab, NUL or similar would end or corrupt a line of the systemd unit); remove it (got \"a\\u0000b\")"]),
    ("control-top-key", {**OK, "x\ty": 1},
     ["x\ty: unknown setting", "x\ty (the name): contains the control character U+0009 (a newline, tab, NUL or similar would end or corrupt a line of the systemd unit); remove it (got \"x\\ty\")"]),
    ("no-name", {"model": "m"},
     ["name: None must be 1-64 letters, digits, '-' or '_' (it becomes part of the systemd unit name)"]),
    ("name-newline", {"name": "a\n", "model": "m"},
     ["name: contains the control character U+000A (a newline, tab, NUL or similar would end or corrupt a line of the systemd unit); remove it (got \"a\\n\")", "name: 'a\\n' must be 1-64 letters, digits, '-' or '_' (it becomes part of the systemd unit name)"]),
    ("draft-no-algo-tokens", {**OK, "speculative": {"ddtreeBudget": 8, "draftAttentionBackend": "fa3"}},
     ["speculative.ddtreeBudget: set, but speculative.algorithm is null; set an algorithm or remove it", "speculative.draftAttentionBackend: set, but speculative.algorithm is null; set an algorithm or remove it"]),
    ("draft-load-format-no-algo", {**OK, "draftLoadFormat": "dummy"},
     ["draftLoadFormat: set, but speculative.algorithm is null"]),
    ("draft-revision-no-draft", {**OK, "draftModelRevision": "main"},
     ["draftModelRevision: set, but draftModel is not"]),
    ("revision-local-model", {**OK, "model": "/models/qwen", "modelRevision": "main"},
     ["modelRevision: model '/models/qwen' is a local directory, which has no hub revision; remove modelRevision (pin a local model by its path)"]),
    ("revision-local-draft", {**D, "draftModel": "./draft", "draftModelRevision": "main"},
     ["draftModelRevision: draftModel './draft' is a local directory, which has no hub revision; remove draftModelRevision (pin a local model by its path)"]),
    ("revisions-hub", {**D, "modelRevision": "a" * 40, "draftModelRevision": "v1"},
     []),
    ("budget-eagle3", {**D, "speculative": {"algorithm": "EAGLE3", "ddtreeBudget": 8}},
     ["speculative.ddtreeBudget: only DDTREE uses a tree budget, not EAGLE3; remove it"]),
    ("budget-ddtree", {**D, "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 8}},
     []),
    ("tp-equal-gpus", {**OK, "gpus": [0, 1], "tpSize": 2},
     []),
    ("tp-no-gpus", {**OK, "tpSize": 4},
     []),
    ("port-max", {**OK, "port": 55535},
     []),
    ("port-above-with-grpc", {**OK, "port": 60000, "environment": {"SGLANG_GRPC_PORT": "50001"}},
     []),
    ("hf-token-env", {**OK, "environment": {"HF_TOKEN": "x", "HUGGING_FACE_HUB_TOKEN": "y"}},
     ["environment.HF_TOKEN: the environment ends up in the unit and the Nix store, which every user can read; put the token in a file and set hfTokenFile", "environment.HUGGING_FACE_HUB_TOKEN: the environment ends up in the unit and the Nix store, which every user can read; put the token in a file and set hfTokenFile"]),
    ("cuda-devices-no-gpus", {**OK, "environment": {"CUDA_VISIBLE_DEVICES": "1"}},
     []),
    ("extra-owned-eq", {**OK, "extraArgs": ["--port=1=2"]},
     ["extraArgs: --port is set by the option port; use that option"]),
    ("extra-alias", {**OK, "extraArgs": ["--tp", "2", "--speculative-dflash-block-size=8"]},
     ["extraArgs: --tp is set by the option tpSize; use that option", "extraArgs: --speculative-dflash-block-size is set by the option speculative.numDraftTokens; use that option"]),
    ("dflash-no-draft", {**OK, "speculative": {"algorithm": "DFLASH"}},
     ["speculative.algorithm: DFLASH needs draftModel (the drafter's repo id or directory, e.g. z-lab/Qwen3-8B-DFlash-b16 for Qwen/Qwen3-8B)"]),
    ("draft-no-algo", {**OK, "draftModel": "z-lab/d", "speculative": {"numDraftTokens": 8}},
     ["speculative.numDraftTokens: set, but speculative.algorithm is null; set an algorithm or remove it", "draftModel: set, but speculative.algorithm is null; set speculative.algorithm (e.g. \"DFLASH\") or remove draftModel"]),
    ("port-above", {**OK, "port": 55536},
     ["port: 55536 is above 55535: SGLang 0.5.11 derives its gRPC port as port + 10000 and refuses to start past 65535; choose a port <= 55535 or set environment.SGLANG_GRPC_PORT"]),
    ("tp-above-gpus", {**OK, "gpus": [3], "tpSize": 2},
     ["tpSize: 2 is larger than the 1 GPU(s) given in gpus [3]; list 2 GPUs or lower tpSize"]),
    ("cuda-devices-and-gpus", {**OK, "gpus": [0], "environment": {"CUDA_VISIBLE_DEVICES": "1"}},
     ["environment.CUDA_VISIBLE_DEVICES: conflicts with gpus; set the GPUs with gpus only"]),
    ("extra-unowned", {**OK, "extraArgs": ["--max-running-requests=64", "--x=a=b"]},
     []),
]


@pytest.mark.parametrize("settings, problems", [(s, p) for _, s, p in CASES], ids=[i for i, _, _ in CASES])
def test_each_setting_is_checked_with_its_own_message(settings, problems):
    assert config.problems_of(settings)[0] == problems


def test_valid_values_come_back_converted():
    _, kw = config.problems_of({**OK, "gpus": [1, 0], "extraArgs": ["--x"], "memFractionStatic": 1,
                                "environment": {"A": "1"}, "draftModel": None})
    assert kw["gpus"] == (1, 0) and kw["extra_args"] == ("--x",) and kw["mem_fraction_static"] == 1.0
    assert isinstance(kw["mem_fraction_static"], float) and kw["environment"] == {"A": "1"}
    assert kw["draft_model"] is None and kw["speculative"] == config.Speculative()
    assert config.problems_of([1]) == (["the settings must be a JSON object"], {})
    assert config.problems_of({"model": "m"}, "b")[1]["name"] == "b"  # the instance's key names it


def test_a_refusal_lists_every_problem_with_the_instance_and_where_it_came_from():
    with pytest.raises(errors.DflashError) as e:
        config.from_dict({"name": "a", "port": 0, "tpSize": 0}, origin="/etc/dflash/a.json")
    assert e.value.what == "invalid settings for instance 'a' in /etc/dflash/a.json"
    assert e.value.why == ("3 problem(s)\n  - model: required (a Hugging Face repo id or a local directory)\n"
                           "  - port: must be an integer from 1 to 65535 (got 0)\n"
                           "  - tpSize: must be an integer from 1 to 64 (got 0)")  # settings.json's order
    assert e.value.fix == ("correct the settings above (keys as in services.dflash.instances.<name>; "
                           "docs/service.md lists them)")
    assert e.value.exit_code == errors.CONFIG
    with pytest.raises(errors.DflashError) as e:
        config.from_dict({"model": ""}, "b")
    assert e.value.what == "invalid settings for instance 'b' in settings"
    with pytest.raises(errors.DflashError) as e:
        config.from_dict({"model": 1})
    assert e.value.what == "invalid settings for instance '?' in settings"


def test_the_settings_file_holds_every_key_and_reads_back():
    cfg = config.from_dict({**D, "gpus": [0, 1], "tpSize": 2, "extraArgs": ["--x"], "environment": {"A": "1"},
                            "speculative": {"algorithm": "DDTREE", "ddtreeBudget": 64}})
    d = config.to_dict(cfg)
    # the settings file's keys: the instance's name, each group, then every other setting, in settings.json's
    # order (the NixOS module and `dflashctl serve --settings` read them); a new setting is there with no
    # change here
    schema = settings_schema.load()
    assert list(d) == ["name", *schema.groups, *(s.name for s in schema.top())]
    assert {"speculative", "model", "gpus", "extraArgs", "stallTimeoutSec"} <= set(d)  # known ones, by value
    for group in schema.groups:
        assert list(d[group]) == [s.name for s in schema.in_group(group)]
    assert {k: v for k, v in d["speculative"].items() if v is not None} == {"algorithm": "DDTREE", "ddtreeBudget": 64}
    assert (d["gpus"], d["extraArgs"], d["environment"], d["port"]) == ([0, 1], ["--x"], {"A": "1"}, 30000)
    assert config.from_dict(d) == cfg


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:30000"), ("0.0.0.0", "http://127.0.0.1:30000"),
                                       ("::", "http://[::1]:30000"), ("fe80::1", "http://[fe80::1]:30000"),
                                       ("gpu1.lan", "http://gpu1.lan:30000")])
def test_the_url_an_instance_answers_on(host, url):
    assert config.from_dict({**OK, "host": host}).base_url == url


def settings_file(tmp_path, data: bytes):
    f = tmp_path / "a.json"
    f.write_bytes(data)
    return f


def test_reading_the_settings_file(tmp_path):
    f = settings_file(tmp_path, json.dumps(OK).encode())
    assert config.read_json(f) == OK and config.read_json(str(f)) == OK
    assert config.load(f) == config.from_dict(OK)
    bad = settings_file(tmp_path, json.dumps({"model": "m", "name": "a", "port": 0}).encode())
    with pytest.raises(errors.DflashError) as e:
        config.load(bad)
    assert e.value.what == f"invalid settings for instance 'a' in {bad}"


MULTI = {"instances": {"b": {"model": "m", "port": 30001}, "a": {"model": "m", "gpus": [1]}}}


def refusal(call) -> tuple:
    with pytest.raises(errors.DflashError) as e:
        call()
    return e.value.what, e.value.why, e.value.fix, e.value.exit_code


def test_a_file_of_several_instances_gives_the_one_named_or_all_of_them(tmp_path):
    f = settings_file(tmp_path, json.dumps(MULTI).encode())
    assert config.instance_of(MULTI, "b", "f") == ("b", {"model": "m", "port": 30001})
    assert config.instance_of(OK, None, "f") == (None, OK) and config.instance_of(OK, "x", "f") == (None, OK)
    assert config.instance_of({"instances": {"z": OK}}, None, "f") == ("z", OK)  # the one there is
    b = config.load(f, "b")
    assert (b.name, b.port, b.gpus) == ("b", 30001, ())
    assert [(c.name, c.gpus) for c in config.load_all(f)] == [("a", (1,)), ("b", ())]  # sorted by name
    one = settings_file(tmp_path, json.dumps(OK).encode())
    assert config.load_all(one) == [config.from_dict(OK)] and config.load(one, "a").name == "a"
    assert refusal(lambda: config.load(one, "c")) == (
        f"{one} has no instance 'c'", "it holds instance 'a'", "pass --name a, or leave --name out", errors.CONFIG)


def test_a_file_of_several_instances_is_refused_with_what_it_holds(tmp_path):
    assert refusal(lambda: config.instance_of(MULTI, None, "f.json")) == (
        "f.json holds 2 instances", "a, b", "pass --name NAME to choose one", errors.CONFIG)
    assert refusal(lambda: config.instance_of(MULTI, "c", "f.json")) == (
        "f.json has no instance 'c'", "it holds a, b", "pass --name one of them", errors.CONFIG)
    shape = ("f.json is not a settings file",
             'a file with "instances" must hold only {"instances": {"<name>": {...}, ...}}, with at least one instance',
             'write one instance\'s settings, or every instance under "instances"', errors.CONFIG)
    for bad in ({"instances": {}}, {"instances": []}, {"instances": {"a": OK}, "model": "m"}):
        assert refusal(lambda: config.instance_of(bad, None, "f.json")) == shape, bad
        f = settings_file(tmp_path, json.dumps(bad).encode())
        assert refusal(lambda: config.load_all(f))[1:] == shape[1:]
        assert refusal(lambda: config.load_all(f))[0] == f"{f} is not a settings file"
    f = settings_file(tmp_path, json.dumps({"instances": {"a": {"model": "m", "port": 0}}}).encode())
    assert refusal(lambda: config.load_all(f))[0] == f"invalid settings for instance 'a' in {f}"
    assert refusal(lambda: config.load(f))[0] == f"invalid settings for instance 'a' in {f}"
    one = settings_file(tmp_path, json.dumps({"name": "a", "model": "m", "port": 0}).encode())
    assert refusal(lambda: config.load_all(one))[0] == f"invalid settings for instance 'a' in {one}"
    multi = settings_file(tmp_path, json.dumps(MULTI).encode())
    assert refusal(lambda: config.load(multi))[:2] == (f"{multi} holds 2 instances", "a, b")


WROTE = "pass the settings file the module or `dflashctl unit` wrote (UTF-8 JSON)"


@pytest.mark.parametrize("data, what, why, fix", [
    (None, "cannot read {f}", "No such file or directory", WROTE),
    (b" " * (1 << 20) + b"{}", "{f} is too large for a settings file", "over 1048576 bytes",
     "pass the settings file itself (a settings file is far smaller)"),
    (b'{"model": "\xff"}', "{f} is not UTF-8 text", "byte 11: invalid start byte",
     "pass the settings file itself (UTF-8 JSON or text)"),
    (b'{"model":\n "m",}', "{f} is not valid JSON", "line 2 column 6: Expecting property name enclosed in double quotes",
     WROTE),
    (b"[" * 100000 + b"]" * 100000, "{f} is not a valid settings file", "its JSON is nested too deeply", WROTE),
    (b'{"model": "a", "model": "b"}', "{f} is ambiguous", 'the key "model" appears twice in one object',
     "keep one of the two (JSON readers disagree on which one wins)"),
], ids=["missing", "too-large", "not-utf8", "not-json", "too-deep", "duplicate-key"])
def test_an_unreadable_settings_file_is_one_config_error(tmp_path, data, what, why, fix):
    f = tmp_path / "a.json" if data is None else settings_file(tmp_path, data)
    with pytest.raises(errors.DflashError) as e:
        config.read_json(f)
    assert (e.value.what, e.value.why, e.value.fix, e.value.exit_code) == (what.format(f=f), why, fix, errors.CONFIG)


def test_a_file_of_exactly_the_limit_is_read(tmp_path):
    f = settings_file(tmp_path, b"{}" + b" " * ((1 << 20) - 2))
    assert config.read_json(f) == {}


def test_long_values_are_cut_in_messages():
    assert config._cut("x" * 80) == "x" * 80
    assert config._cut("x" * 81) == "x" * 80 + "… (81 characters)"
    assert config._brief({"a": 1}) == '{"a": 1}'


def test_the_checkers_made_for_each_key():
    """The factories behind KEYS, called here (KEYS holds the checkers they made at import)."""
    tp = config._int(1, 64)
    assert [tp(v) for v in (1, 64)] == [1, 64]
    for bad in (0, 65, True, 2.5, "2"):
        with pytest.raises(ValueError, match="^an integer from 1 to 64$"):
            tp(bad)
    ctx = config._int(1)
    assert ctx(10**12) == 10**12
    with pytest.raises(ValueError, match="^an integer >= 1$"):
        ctx(0)
    with pytest.raises(ValueError, match="^an integer from 0 to 0$"):
        config._int(0, 0)(1)
    assert config._int(0, 0)(0) == 0
    grammar = config._choice("xgrammar", "none")
    assert grammar("none") == "none"
    with pytest.raises(ValueError) as e:
        grammar("x")
    assert str(e.value) == 'one of "xgrammar", "none"'
    opt = config._opt(config._int(1, 2))
    assert opt(None) is None and opt(2) == 2
    with pytest.raises(ValueError):
        opt(3)
    with pytest.raises(ValueError) as e:
        config._environment(["A=1"])
    assert str(e.value) == 'an object of strings, e.g. {"NCCL_DEBUG": "WARN"}'
    assert config._environment({"A" * 4096: "x"}) == {"A" * 4096: "x"}  # a name of the longest length


def test_the_instances_key_names_it_and_a_bad_speculative_block_leaves_the_default():
    assert config.from_dict({"model": "m"}, "b").name == "b"
    assert config.problems_of({**OK, "speculative": "x"})[1]["speculative"] == config.Speculative()
