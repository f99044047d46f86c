"""The model pair checked before any weights load: the published pairs fit, each mismatch is refused
with its reason, offline hosts read only the cache, bad files are named, never a traceback.

The pairs are config.json files written from the published values (tests/data/models/README.md
says where each value comes from); the rules are host/model_pair.py, the files are found by
service/model_check.py as serve's preflight and `dflashctl validate --models` find them.
"""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from fake_hub import FakeHub
from h200_recordings import IDLE
from hub_cache_layout import COMMIT
from model_pair_files import (DATA, LLAMA, LLAMA_DRAFT, QWEN, QWEN_DRAFT, VOCAB, cached_pair, hub_settings,
                              tokenizer_json)
from serve_fixture import NEVER

from dflashctl import errors
from dflashctl.host import gpus, model_pair, sglang_models
from dflashctl.host.model_pair import FAIL, WARN
from dflashctl.service import config, model_check

REPO = Path(__file__).resolve().parent.parent.parent
# A chat template of ours with the shape of Qwen3's: it thinks unless enable_thinking is false.
THINKING_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
                     "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
                     "<think>\n\n</think>\n\n{% endif %}{% endif %}")


def published(name: str) -> dict:
    return json.loads((DATA / name / "config.json").read_text())


def rules(findings, level=FAIL) -> list[str]:
    return [f.rule for f in findings if f.level == level]


def model_dir(root: Path, name: str, edit=None, tokenizer: str | None = None, chat_template: str | None = None,
              shards: int = 2, total_size: int | None = 16 * 2**30) -> Path:
    """A model directory as SGLang reads it: the published config.json (edited), a tokenizer where
    given, and a sharded safetensors index whose shards are placeholders (the size is the index's)."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = published(name)
    if edit:
        edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    if tokenizer is not None:
        (d / "tokenizer.json").write_text(tokenizer)
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template or "{{ x }}"}))
    if shards:
        names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        index = {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}
        if total_size:
            index["metadata"] = {"total_size": total_size}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        for n in names:
            (d / n).write_bytes(b"\0" * 64)
    return d


def instance(target: Path | str, draft: Path | str | None, **settings) -> config.InstanceConfig:
    spec = settings.pop("speculative", {"algorithm": "DFLASH"} if draft else {})
    return config.from_dict({"name": "pair", "model": str(target), "speculative": spec,
                             **({"draftModel": str(draft)} if draft else {}), **settings})


def checks_of(cfg, env=None) -> dict[str, list]:
    found = model_check.check(cfg, env or {}, "/etc/dflash/pair.json").checks
    return {s: [c for c in found if c.status == s] for s in ("ok", "warn", "fail")}


# --- the rules over the published shapes ------------------------------------------------------------

def test_the_published_pairs_fit():
    assert model_pair.check_target(published(QWEN), "DFLASH") == []
    assert model_pair.check_pair(published(QWEN), published(QWEN_DRAFT), "DFLASH", 16) == []
    assert model_pair.check_pair(published(QWEN), published(QWEN_DRAFT), "DFLASH", None) == []
    assert model_pair.check_target(published(LLAMA), "DFLASH") == []
    assert model_pair.check_pair(published(LLAMA), published(LLAMA_DRAFT), "DFLASH", None) == []
    # Llama's config has no head_dim: SGLang derives 4096 / 32 = 128, as the drafter states it
    assert model_pair.attention_shape(published(LLAMA))["head_dim"] == 128


def qwen4b_shape(t):  # Qwen3-4B: 2560 wide, 9728 MLP, tied embeddings; otherwise Qwen3-8B's shape
    t.update(hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True)


@pytest.mark.parametrize("target, draft, edit_target, edit_draft, settings, expected", [
    # the Qwen3-8B drafter in front of a Qwen3-4B-shaped target
    (QWEN, QWEN_DRAFT, qwen4b_shape, None, {}, ["hidden_size"]),
    # the Llama drafter in front of Qwen3-8B: same width and heads, so SGLang would load and serve it
    (QWEN, LLAMA_DRAFT, None, None, {}, ["vocab_size", "num_target_layers"]),
    (LLAMA, QWEN_DRAFT, None, None, {}, ["vocab_size", "target_layer_ids", "num_target_layers",
                                         "mask_token_id"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].update(target_layer_ids=[1, 9, 17, 25, 36]), {},
     ["target_layer_ids"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].update(target_layer_ids=[1, 9, 17, 25, 35]), {},
     ["target_layer_ids"]),  # the last layer: SGLang accepts it, but never captures it
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].update(target_layer_ids="1,9"), {},
     ["target_layer_ids"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].update(mask_token_id=151936), {}, ["mask_token_id"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].update(mask_token_id=-1), {}, ["mask_token_id"]),
    (QWEN, QWEN_DRAFT, None, None, {"num_draft_tokens": 32}, ["numDraftTokens"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.update(architectures=["Qwen3ForCausalLM"]), {}, ["architectures"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.pop("architectures"), {}, ["architectures"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.update(num_attention_heads=16), {}, ["num_attention_heads"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.update(num_key_value_heads=4), {}, ["num_key_value_heads"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.update(head_dim=64), {}, ["head_dim"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.update(hidden_act="gelu"), {}, ["hidden_act"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d.pop("num_hidden_layers"), {}, ["num_hidden_layers"]),
    (QWEN, QWEN_DRAFT, None, None, {"tp_size": 3}, ["tpSize"]),
    (QWEN, QWEN_DRAFT, lambda t: t.update(architectures=["Qwen2ForCausalLM"]), None, {}, ["target"]),
    (QWEN, QWEN_DRAFT, None, lambda d: d["dflash_config"].pop("mask_token_id"), {"skip_tokenizer_init": True},
     ["mask_token_id"]),
])
def test_each_mismatch_is_refused_with_its_reason(target, draft, edit_target, edit_draft, settings, expected):
    t, d = published(target), published(draft)
    for cfg, edit in ((t, edit_target), (d, edit_draft)):
        if edit:
            edit(cfg)
    found = model_pair.check_pair(t, d, "DFLASH", settings.pop("num_draft_tokens", None), **settings)
    assert rules(found) == expected, [f.line() for f in found]
    for f in found:  # each names both sides, the SGLang behaviour and the fix
        assert f.text and f.fix and f.sglang, f


def test_the_reasons_name_the_values_and_sglangs_behaviour():
    t, d = published(QWEN), published(LLAMA_DRAFT)
    by_rule = {f.rule: f for f in model_pair.check_pair(t, d, "DFLASH", None)}
    assert by_rule["vocab_size"].text == "drafter 128256 != target 151936"
    assert "acceptance near 1" in by_rule["vocab_size"].sglang
    assert by_rule["num_target_layers"].text == ("the drafter was trained on a target with 32 layers, "
                                                 "this target has 36")
    assert "use the drafter trained for this target" in by_rule["num_target_layers"].fix
    d = published(QWEN_DRAFT)
    d["dflash_config"]["target_layer_ids"] = [1, 9, 17, 25, 36]
    [f] = model_pair.check_pair(t, d, "DFLASH", None)
    assert "layer(s) [36] outside the target's 36 layers (0..35)" in f.text
    assert "resolve_target_layer_ids" in f.sglang
    [f] = model_pair.check_pair(t, published(QWEN_DRAFT), "DFLASH", 32)
    assert f.fix == "set speculative.numDraftTokens = 16, or null (SGLang then takes the drafter's block_size)"


def test_fewer_draft_tokens_than_the_block_and_a_second_block_size_are_warnings():
    t, d = published(QWEN), published(QWEN_DRAFT)
    assert rules(model_pair.check_pair(t, d, "DFLASH", 8), WARN) == ["numDraftTokens"]
    d["dflash_config"]["block_size"] = 8  # SGLang reads dflash_config's first
    found = model_pair.check_pair(t, d, "DFLASH", 8)
    assert rules(found, WARN) == ["block_size"] and rules(found) == []


def test_an_eagle3_drafter_under_dflash_and_the_reverse_say_which_algorithm():
    t, eagle = published(LLAMA), published(LLAMA_DRAFT)
    eagle.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
    [f] = [f for f in model_pair.check_pair(t, eagle, "DFLASH", None) if f.rule == "architectures"]
    assert 'set speculative.algorithm = "EAGLE3"' in f.text
    assert model_pair.check_pair(t, eagle, "EAGLE3") == []
    [f] = model_pair.check_pair(t, published(LLAMA_DRAFT), "EAGLE3")[:1]
    assert f.rule == "architectures" and 'set speculative.algorithm = "DFLASH"' in f.text


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.update(num_hidden_layers=2), ["num_hidden_layers"]),
    (lambda d: d.update(hidden_size=2048), ["hidden_size"]),
    (lambda d: d.update(target_hidden_size=5120), ["target_hidden_size"]),
    (lambda d: d.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 31]}),
     ["eagle_aux_hidden_state_layer_ids"]),
    (lambda d: d.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15]}),
     ["eagle_aux_hidden_state_layer_ids"]),
])
def test_what_sglang_needs_of_an_eagle3_drafter(edit, expected):
    t = published(LLAMA)
    d = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "num_hidden_layers": 1,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    assert model_pair.check_pair(t, d, "EAGLE3") == []
    edit(d)
    assert rules(model_pair.check_pair(t, d, "EAGLE3")) == expected


def test_a_target_alone_needs_an_architecture_sglang_has():
    t = published(QWEN)
    t["architectures"] = ["NoSuchModelForCausalLM"]
    assert rules(model_pair.check_target(t, None), WARN) == ["architectures"]  # the Transformers backend
    assert rules(model_pair.check_target(t, "DFLASH")) == ["architectures"]  # which has no DFlash hook
    [f] = model_pair.check_target(published(QWEN_DRAFT), None)  # model and draftModel swapped
    assert f.level == FAIL and "swap model and draftModel" in f.fix
    t.pop("architectures")
    assert rules(model_pair.check_target(t, None)) == ["architectures"]


def test_a_thinking_template_in_front_of_a_non_thinking_drafter_is_warned_about():
    f = model_pair.thinking_finding(THINKING_TEMPLATE, "z-lab/Qwen3-8B-DFlash-b16")
    assert f.level == WARN and "half the acceptance" in f.text
    assert '"chat_template_kwargs": {"enable_thinking": false}' in f.fix and "--chat-template" in f.fix
    assert model_pair.thinking_finding(THINKING_TEMPLATE, "/nix/store/abc-Qwen3-8B-DFlash-b16") is not None
    assert model_pair.thinking_finding(THINKING_TEMPLATE, "z-lab/Qwen3-Coder-30B-A3B-DFlash") is None
    assert model_pair.thinking_finding("{{ messages }}", "z-lab/Qwen3-8B-DFlash-b16") is None


# --- the files, where SGLang reads them -----------------------------------------------------------

def test_a_fitting_local_pair_passes(tmp_path):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB))
    d = model_dir(tmp_path, QWEN_DRAFT, shards=1, total_size=2 * 2**30)
    got = checks_of(instance(t, d, speculative={"algorithm": "DFLASH", "numDraftTokens": 16}))
    assert got["fail"] == [] and got["warn"] == [], got
    [ok] = got["ok"]
    assert ok.summary.startswith(f"target Qwen3ForCausalLM (local directory {t}) and drafter DFlashDraftModel")
    found = model_check.check(instance(t, d), {}, "x")
    assert found.weight_bytes == 18 * 2**30  # the indexes' total_size


def test_a_mismatched_local_pair_is_refused_with_exit_79(tmp_path):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB))
    d = model_dir(tmp_path, LLAMA_DRAFT)
    got = checks_of(instance(t, d))
    assert [c.name for c in got["fail"]] == ["models: vocab_size", "models: num_target_layers"]
    assert {c.exit_code for c in got["fail"]} == {errors.PREFLIGHT_MODEL_PAIR}
    # the directory is named after Qwen/Qwen3-8B: the fix names z-lab's drafter for it
    assert got["fail"][0].fix == "use the drafter trained for this target: z-lab/Qwen3-8B-DFlash-b16"
    assert errors.PREFLIGHT_MODEL_PAIR in errors.NO_RESTART  # it will not fit on the next try either


def test_a_different_tokenizer_is_named_and_the_same_one_passes(tmp_path):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB, ("<|im_start|>",)))
    same = model_dir(tmp_path / "same", QWEN_DRAFT, tokenizer=tokenizer_json(VOCAB, ("<|im_start|>",)))
    assert checks_of(instance(t, same))["fail"] == []
    other = model_dir(tmp_path / "other", QWEN_DRAFT,
                      tokenizer=tokenizer_json(VOCAB[:40] + ["zz"] + VOCAB[41:], ("<|im_start|>",)))
    [f] = checks_of(instance(t, other))["fail"]
    assert f.name == "models: tokenizer" and "tokenizer.json differ" in f.summary
    assert "1 token ids differ, the first 40: 'tok40' in the target, 'zz' in the drafter" in f.summary


def test_the_thinking_warning_comes_from_the_targets_chat_template(tmp_path):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB), chat_template=THINKING_TEMPLATE)
    d = model_dir(tmp_path / "z-lab", QWEN_DRAFT)
    d = d.rename(d.parent / "Qwen3-8B-DFlash-b16")
    got = checks_of(instance(t, d))
    assert [c.name for c in got["warn"]] == ["models: thinking"] and got["fail"] == []


def test_a_mask_token_the_tokenizer_cannot_hold_is_refused(tmp_path):
    """No mask_token_id: SGLang adds <|MASK|> to the target's tokenizer, beyond its vocabulary here."""
    def full_vocab(t):
        t["vocab_size"] = 64
    t = model_dir(tmp_path, QWEN, edit=full_vocab, tokenizer=tokenizer_json(VOCAB))
    d = model_dir(tmp_path, QWEN_DRAFT, edit=lambda c: (c["dflash_config"].pop("mask_token_id"),
                                                        c.update(vocab_size=64)))
    [f] = checks_of(instance(t, d))["fail"]
    assert f.name == "models: mask_token_id" and "add it at id 64, outside the vocabulary of 64" in f.summary


@pytest.mark.parametrize("damage, name, words", [
    (lambda d: (d / "config.json").unlink(), "models: draftModel config", "has no config.json"),
    (lambda d: (d / "config.json").write_text('{"hidden_size": 4096,'), "models: draftModel config",
     "is not valid JSON: line 1 column"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "models: draftModel config", "is not a JSON object"),
    (lambda d: (d / "config.json").write_bytes(b"\xff\xfe"), "models: draftModel config", "is not UTF-8"),
    (lambda d: (d / "model.safetensors.index.json").write_text("{"), "models: draftModel weights",
     "is not valid JSON"),
    (lambda d: ((d / "config.json").unlink(), (d / "config.json").mkdir()), "models: draftModel config",
     "cannot read"),  # an OSError on the way is named too
])
def test_bad_drafter_files_are_named(tmp_path, damage, name, words):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB))
    d = model_dir(tmp_path, QWEN_DRAFT)
    damage(d)
    [f] = checks_of(instance(t, d))["fail"]
    assert f.name == name and words in f.summary and f.exit_code == errors.PREFLIGHT_MODEL_PAIR, f


def test_a_target_without_a_tokenizer_is_refused_unless_skipped(tmp_path):
    t = model_dir(tmp_path, QWEN)
    [f] = checks_of(instance(t, None))["fail"]
    assert f.name == "models: tokenizer" and "has no tokenizer files" in f.summary
    assert "skipTokenizerInit = true" in f.fix and "--tokenizer-path" in f.fix
    assert checks_of(instance(t, None, skipTokenizerInit=True))["fail"] == []
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(tokenizer_json(VOCAB))
    assert checks_of(instance(t, None, extraArgs=["--tokenizer-path", str(tok)]))["fail"] == []


def test_local_weights_missing_a_shard_are_refused_and_dummy_weights_need_none(tmp_path):
    t = model_dir(tmp_path, QWEN, tokenizer=tokenizer_json(VOCAB))
    (t / "model-00002-of-00002.safetensors").unlink()
    [f] = checks_of(instance(t, None))["fail"]
    assert f.name == "models: model weights" and "model-00002-of-00002.safetensors" in f.summary
    assert f.exit_code == errors.PREFLIGHT_MODEL_MISSING
    assert checks_of(instance(t, None, loadFormat="dummy"))["fail"] == []
    gone = checks_of(instance(tmp_path / "nowhere", None))["fail"]
    assert [c.summary for c in gone] == [f"{tmp_path / 'nowhere'} is not a directory on this host"]


def test_weights_larger_than_the_gpus_share_are_warned_about():
    snapshot = gpus.load_recording(IDLE)["nvml"]  # the H200: 140.4 GiB
    cfg = instance("/m", None, memFractionStatic=0.5, gpus=[0])
    assert model_check.memory_check(cfg, 60 * 2**30, snapshot, [0]) is None
    w = model_check.memory_check(cfg, 80 * 2**30, snapshot, [0])
    assert w.status == "warn" and "80.0 GiB per GPU (tpSize 1)" in w.summary
    assert "memFractionStatic 0.5 x 140.4 GiB = 70.2 GiB" in w.summary and "raise tpSize" in w.fix
    two = instance("/m", None, memFractionStatic=0.5, gpus=[0, 1], tpSize=2)
    assert model_check.memory_check(two, 80 * 2**30, snapshot, [0]) is None  # 40 GiB each


# --- the hub cache: offline hosts read only it, and nothing here asks the hub ---------------------

@pytest.fixture
def hub():
    h = FakeHub({})  # serves nothing: any request made here is a failure of the rule
    yield h
    h.close()


def validate_models(settings: dict, tmp_path: Path, hub, *extra: str) -> subprocess.CompletedProcess:
    f = tmp_path / "instance.json"
    f.write_text(json.dumps(settings))
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), HF_ENDPOINT=hub.url)
    return subprocess.run([sys.executable, "-m", "dflashctl", "validate", str(f), "--models", *extra],
                          capture_output=True, text=True, env=env, timeout=120)


def test_offline_hosts_read_the_pair_from_the_cache_only(tmp_path, hub):
    home = tmp_path / "hf"
    cached_pair(home)
    run = validate_models(hub_settings(home), tmp_path, hub)
    assert run.returncode == 0, run.stderr
    cached_pair(tmp_path / "hf2", draft=LLAMA_DRAFT, manifest=False)
    run = validate_models(hub_settings(tmp_path / "hf2"), tmp_path, hub)
    assert run.returncode == errors.PREFLIGHT_MODEL_PAIR, run.stderr
    assert "the models do not fit" in run.stderr
    assert "models: vocab_size: drafter 128256 != target 151936" in run.stderr
    assert "Traceback" not in run.stderr
    assert hub.requests == []  # never the hub


def test_a_hub_model_not_fetched_yet_is_deferred_online_and_refused_offline(tmp_path, hub):
    home = tmp_path / "empty"
    # online, validate says what it could not check and fails unless told that is accepted
    run = validate_models(hub_settings(home, offline=False), tmp_path, hub)
    assert run.returncode == errors.PREFLIGHT_MODEL_MISSING, run.stderr
    assert "Qwen/Qwen3-8B@" in run.stderr and "--skip-unfetched" in run.stderr
    assert "dflashctl models fetch --config" in run.stderr
    run = validate_models(hub_settings(home, offline=False), tmp_path, hub, "--skip-unfetched")
    assert run.returncode == 0, run.stderr
    assert "Qwen/Qwen3-8B@" in run.stderr and "not checked (--skip-unfetched)" in run.stderr
    run = validate_models(hub_settings(home), tmp_path, hub)
    assert run.returncode == errors.PREFLIGHT_MODEL_MISSING, run.stderr
    assert hub.requests == []


def test_a_partial_cache_online_is_a_warning(tmp_path, hub):
    home = tmp_path / "hf"
    cached_pair(home)
    blob = (home / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / COMMIT / "model.safetensors").resolve()
    blob.write_bytes(b"\0" * 3)  # the manifest lists 128 bytes
    run = validate_models(hub_settings(home, offline=False), tmp_path, hub)
    assert run.returncode == 0, run.stderr
    assert "models: model weights: Qwen/Qwen3-8B is partial in the cache (model.safetensors)" in run.stderr
    config_json = home / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / COMMIT / "config.json"
    config_json.resolve().unlink()  # an interrupted download: SGLang fetches it online
    run = validate_models(hub_settings(home, offline=False), tmp_path, hub)
    assert run.returncode == errors.PREFLIGHT_MODEL_MISSING, run.stderr
    run = validate_models(hub_settings(home, offline=False), tmp_path, hub, "--skip-unfetched")
    assert run.returncode == 0, run.stderr
    assert "Qwen/Qwen3-8B@" + COMMIT in run.stderr and "not checked (--skip-unfetched)" in run.stderr
    assert hub.requests == []


def test_serve_refuses_a_mismatched_pair_before_sglang_starts(serve, stack_python, tmp_path):  # noqa: F811
    home = tmp_path / "hf"
    cached_pair(home, draft=LLAMA_DRAFT)
    proc = serve("healthy", ["--python", stack_python], settings=hub_settings(home, memFractionStatic=0.5),
                 env={gpus.REPLAY_ENV: str(IDLE)})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_MODEL_PAIR, err
    assert "preflight: 2 of" in err and "SGLang was not started" in err
    assert "models: vocab_size: drafter 128256 != target 151936" in err
    assert "fix: use the drafter trained for this target" in err
    assert not (proc.tmp / "argv.json").exists()


def test_serve_goes_ahead_with_a_fitting_pair(serve, stack_python, tmp_path):  # noqa: F811
    home = tmp_path / "hf"
    cached_pair(home)
    proc = serve("healthy", ["--python", stack_python], settings=hub_settings(home, memFractionStatic=0.5),
                 env={gpus.REPLAY_ENV: str(IDLE)})
    assert proc.notify.recv_until("READY=1", proc), proc.communicate(timeout=NEVER)[1]


# --- SGLang's registry, read from its source --------------------------------------------------------

def test_the_registry_is_read_from_sglangs_source_without_importing_it(tmp_path):
    import shutil
    tree = tmp_path / "sglang"
    shutil.copytree(DATA / "sglang-tree" / "sglang", tree)
    (tree / "srt" / "models" / "broken.py").write_text("class Broken(\n")  # skipped, as SGLang skips it
    got = sglang_models.scan(tree, "9.9")
    assert got["architectures"] == ["BaseForCausalLM", "BaseForCausalLMEagle3", "ChildForCausalLM",
                                    "CousinForCausalLM", "DFlashDraftModel", "PlainForCausalLM"]
    assert got["dflash_targets"] == got["eagle3_targets"] == ["BaseForCausalLM", "ChildForCausalLM",
                                                              "CousinForCausalLM"]
    assert (got["dflash_drafters"], got["eagle3_drafters"]) == (["DFlashDraftModel"], ["BaseForCausalLMEagle3"])


def test_the_shipped_registry_is_the_pinned_sglangs():
    spec = tomllib.loads((REPO / "nix" / "stack.toml").read_text())
    pins = [p for p in json.dumps(spec).split('"') if p.startswith("sglang==")]
    data = sglang_models.load()
    assert pins == [f"sglang=={data['sglang']}"]
    for arch in ("Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM"):
        assert arch in data["dflash_targets"] and arch in data["eagle3_targets"]
    assert "Qwen2ForCausalLM" in data["eagle3_targets"] and "Qwen2ForCausalLM" not in data["dflash_targets"]
    assert data["dflash_drafters"] == ["DFlashDraftModel"]
    assert data["eagle3_drafters"] == ["LlamaForCausalLMEagle3"]
