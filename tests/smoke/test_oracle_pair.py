"""The oracle pair smoke writes (dflashctl/smoke/oracle.py), checked against what it must do.

The files are read back by an independent numpy forward of both architectures as SGLang 0.5.11
computes them (tests/oracle_reference.py): the target must follow its rule, DFLASH's loop must
commit whole blocks with the oracle drafter and part of them with the poisoned one, exactly as
the rule predicts, and a KV step written to the wrong slots must change the output.
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")  # the reference forward; the generator itself needs none

import oracle_reference as ref  # noqa: E402

from dflashctl.host import model_pair  # noqa: E402
from dflashctl.smoke import loadgen, oracle  # noqa: E402

PYTHON_DIR = Path(__file__).resolve().parent.parent.parent / "python"
# sha256 of the default pair: written here and, byte for byte, on the H200 (docs/gpu/smoke-oracle-h200.json)
DEFAULT_HASH = "9d82f9511034e8374359eb4091c73b6bbe81e0bb1705b3903732188f711b639b"
PROMPTS = loadgen.token_prompts(8, 32, 0)  # smoke's default prompts
N = 48  # three verify blocks: accepted drafts' KV is read back by the rule (15 positions later)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> oracle.Pair:
    return oracle.write_pair(tmp_path_factory.mktemp("oracle"))


def test_two_processes_write_the_same_bytes_with_the_hash_the_h200_wrote(tmp_path):
    code = ("import sys; from dflashctl.smoke import oracle; "
            "print(oracle.write_pair(sys.argv[1]).content_hash)")
    hashes = []
    for name in ("a", "b"):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], capture_output=True, text=True,
                             check=True, env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"})
        hashes.append(out.stdout.strip())
    assert hashes == [DEFAULT_HASH, DEFAULT_HASH]
    a, b = (tmp_path / n / f"oracle-{DEFAULT_HASH[:16]}" for n in ("a", "b"))
    for f in sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert oracle.hash_of_dir(a) == DEFAULT_HASH


def test_a_pair_on_disk_is_reused_by_its_hash_and_a_damaged_one_rewritten(tmp_path):
    first = oracle.write_pair(tmp_path)
    again = oracle.write_pair(tmp_path)
    assert (first.reused, again.reused, again.root) == (False, True, first.root)
    st = first.target / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[-1] ^= 1
    st.write_bytes(bytes(data))
    fixed = oracle.write_pair(tmp_path)
    assert not fixed.reused and oracle.hash_of_dir(fixed.root) == DEFAULT_HASH
    assert [p.name for p in tmp_path.iterdir()] == [first.root.name]  # no temporary left behind


def expected_names(cfg: dict, draft: bool) -> dict[str, list[int]]:
    """Every parameter SGLang 0.5.11 loads for the architecture, with its shape from config.json."""
    d, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]
    prefix = "layers." if draft else "model.layers."
    out = {}
    for n in range(cfg["num_hidden_layers"]):
        p = f"{prefix}{n}."
        out.update({p + "input_layernorm.weight": [d], p + "post_attention_layernorm.weight": [d],
                    p + "self_attn.q_proj.weight": [heads * hd, d], p + "self_attn.k_proj.weight": [kv * hd, d],
                    p + "self_attn.v_proj.weight": [kv * hd, d], p + "self_attn.o_proj.weight": [d, heads * hd],
                    p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                    p + "mlp.gate_proj.weight": [inter, d], p + "mlp.up_proj.weight": [inter, d],
                    p + "mlp.down_proj.weight": [d, inter]})
    if draft:
        captured = len(cfg["dflash_config"]["target_layer_ids"])
        out.update({"norm.weight": [d], "hidden_norm.weight": [d], "fc.weight": [d, captured * d]})
    else:
        out.update({"model.embed_tokens.weight": [cfg["vocab_size"], d], "model.norm.weight": [d],
                    "lm_head.weight": [cfg["vocab_size"], d]})
    return out


@pytest.mark.parametrize("model", oracle.MODELS)
def test_every_tensor_is_written_in_bf16_with_its_shape(pair, model):
    """SGLang leaves a tensor missing from the file uninitialised without a word."""
    cfg = json.loads((pair.root / model / "config.json").read_text())
    raw = (pair.root / model / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__")
    assert {k: h["shape"] for k, h in header.items()} == expected_names(cfg, model != "target")
    assert {h["dtype"] for h in header.values()} == {"BF16"}
    spans = sorted(tuple(h["data_offsets"]) for h in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] == len(raw) - 8 - n  # the data fills the file exactly


def test_configs_form_a_dflash_pair(pair):
    target = json.loads((pair.target / "config.json").read_text())
    for model in ("draft", "draft-poisoned"):
        draft = json.loads((pair.root / model / "config.json").read_text())
        assert model_pair.check_pair(target, draft, "DFLASH", 16, skip_tokenizer_init=True) == []
        assert draft["architectures"] == ["DFlashDraftModel"] and draft["dflash_config"]["block_size"] == 16
        mask = draft["dflash_config"]["mask_token_id"]
        assert target["hidden_size"] - 1 <= mask < target["vocab_size"]  # no id code, inside the vocabulary
    assert target["architectures"] == ["Qwen3ForCausalLM"] and target["num_key_value_heads"] == 16
    assert json.loads((pair.target / "generation_config.json").read_text())["eos_token_id"] == 0


def test_shapes_that_cannot_carry_the_construction_are_refused():
    with pytest.raises(Exception, match="mask_token_id"):
        oracle.files(oracle.OracleShape(mask_token_id=5))
    with pytest.raises(Exception, match="lag"):
        oracle.files(oracle.OracleShape(block_size=32))


def test_reference_target_follows_the_rule_with_a_wide_margin(pair):
    for prompt in PROMPTS[:2]:
        out, gap = ref.plain(pair.target, prompt, N)
        seq = prompt + out
        assert all(seq[i] == oracle.succ(pair.shape, seq[i - 15]) for i in range(len(prompt), len(seq)))
        assert out == oracle.greedy(pair.shape, prompt, N)
        assert gap > 8  # bf16 logits: top-1 ahead of top-2 by far more than any rounding


def test_reference_oracle_drafter_commits_whole_blocks_losslessly(pair):
    prompt = PROMPTS[0]
    out, steps = ref.speculative(pair.target, pair.draft, prompt, N)
    assert out == oracle.greedy(pair.shape, prompt, N)
    assert steps == [16, 16, 15] == oracle.verify_steps(pair.shape, prompt, N, poisoned=False)


def test_reference_poisoned_drafter_accepts_part_of_each_block_as_the_rule_predicts(pair):
    for prompt in PROMPTS[:2]:
        out, steps = ref.speculative(pair.target, pair.poisoned, prompt, N)
        assert out == oracle.greedy(pair.shape, prompt, N)
        assert steps == oracle.verify_steps(pair.shape, prompt, N, poisoned=True)
        assert any(1 < s < 16 for s in steps) and 1 < N / len(steps) < 16


def test_reference_kv_written_to_the_wrong_slots_diverges(pair):
    """The accepted drafts' KV replaced by the verified token's: the rule reads it 15 later."""
    prompt = PROMPTS[0]
    out, _ = ref.speculative(pair.target, pair.draft, prompt, N, fault="stale_kv")
    good = oracle.greedy(pair.shape, prompt, N)
    first = next(i for i, (a, b) in enumerate(zip(out, good)) if a != b)
    assert 16 <= first < 32  # inside the second block: the first block's KV was re-read


def test_reference_broken_drafter_is_rejected_but_stays_lossless(tmp_path):
    broken = oracle.write_pair(tmp_path, oracle.OracleShape(draft_offset_error=-1))
    assert broken.content_hash != DEFAULT_HASH
    out, steps = ref.speculative(broken.target, broken.draft, PROMPTS[0], 24)
    assert out == oracle.greedy(broken.shape, PROMPTS[0], 24) and set(steps) == {1}


def test_rule_predictions_match_what_the_h200_counted():
    """The acceptance band's centre: oracle.verify_steps for the recorded prompts, against the
    verify counts SGLang 0.5.11 reported on the H200 for each request."""
    data = Path(__file__).resolve().parent.parent / "data" / "smoke" / "h200-oracle"
    shape = oracle.OracleShape()
    for run, poisoned in (("DFLASH", False), ("DFLASH-poisoned", True)):
        for g in json.loads((data / f"{run}.json").read_text())["generate"]:
            prompt, meta = g["request"]["input_ids"], g["final"]["meta_info"]
            assert meta["spec_verify_ct"] == len(oracle.verify_steps(shape, prompt, 256, poisoned))
            assert g["final"]["output_ids"] == oracle.greedy(shape, prompt, 256)
