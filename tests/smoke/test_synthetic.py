"""The synthetic model pair `dflashctl smoke` writes: configs a DFlash drafter can serve with."""

import json

import pytest

from dflashctl.errors import DflashError
from dflashctl.host import model_pair
from dflashctl.smoke import synthetic


def read_pair(tmp_path, shape=synthetic.PairShape()):
    target_dir, draft_dir = synthetic.write_pair(tmp_path, shape)
    load = lambda d, f: json.loads((d / f).read_text())  # noqa: E731
    return (load(target_dir, "config.json"), load(draft_dir, "config.json"),
            load(target_dir, "generation_config.json"), load(draft_dir, "generation_config.json"))


def test_written_pair_is_consistent(tmp_path):
    target, draft, tgen, dgen = read_pair(tmp_path)
    assert target["architectures"] == ["Qwen3ForCausalLM"] and target["model_type"] == "qwen3"
    assert draft["architectures"] == ["DFlashDraftModel"]
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        assert draft[key] == target[key], key
    assert target["num_attention_heads"] * target["head_dim"] == target["hidden_size"]
    dflash = draft["dflash_config"]
    assert dflash["target_layer_ids"] and all(0 <= i < target["num_hidden_layers"]
                                              for i in dflash["target_layer_ids"])
    assert draft["num_target_layers"] == target["num_hidden_layers"]
    assert 0 <= dflash["mask_token_id"] < target["vocab_size"]
    assert dflash["block_size"] == draft["block_size"] == 16
    # eos 0 with ignore_eos: every request decodes exactly max_new_tokens
    assert tgen == dgen == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    assert model_pair.check_pair(target, draft, "DFLASH", 16, skip_tokenizer_init=True) == []


def test_block_size_follows_num_draft_tokens(tmp_path):
    _, draft, _, _ = read_pair(tmp_path, synthetic.shape_for_block(8))
    assert draft["block_size"] == draft["dflash_config"]["block_size"] == 8


def test_block_below_two_is_refused():
    with pytest.raises(DflashError, match="too small"):
        synthetic.shape_for_block(1)


@pytest.mark.parametrize("edit, problem", [
    (lambda t, d: d.update(hidden_size=2048), "hidden_size"),
    (lambda t, d: d.update(head_dim=128), "head_dim"),
    (lambda t, d: d.update(vocab_size=32000), "vocab_size"),
    (lambda t, d: d["dflash_config"].update(target_layer_ids=[1, 8]), "target_layer_ids"),
    (lambda t, d: d["dflash_config"].update(target_layer_ids=[]), "target_layer_ids"),
    (lambda t, d: d["dflash_config"].update(mask_token_id=151936), "mask_token_id"),
    (lambda t, d: d["dflash_config"].update(block_size=8), "numDraftTokens"),  # 16 asked of a b8 drafter
    (lambda t, d: d.update(num_target_layers=36), "num_target_layers"),
])
def test_the_shared_rules_name_each_mismatch_of_the_synthetic_pair(edit, problem):
    """synthetic.write_pair holds its pair to host/model_pair.py, the rules serve's preflight uses."""
    shape = synthetic.PairShape()
    target, draft = synthetic.target_config(shape), synthetic.draft_config(shape)
    edit(target, draft)
    found = model_pair.check_pair(target, draft, "DFLASH", shape.block_size, skip_tokenizer_init=True)
    assert [f.rule for f in found if f.level == model_pair.FAIL] == [problem], found


def test_bad_shape_is_refused_before_writing(tmp_path):
    with pytest.raises(DflashError, match="target_layer_ids"):
        synthetic.write_pair(tmp_path, synthetic.PairShape(target_layer_ids=(1, 9)))
    assert not any(tmp_path.iterdir())
