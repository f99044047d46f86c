"""A tiny Qwen3-style target and a matching DFlash draft, as config files only.

SGLang gives them random weights (`--load-format dummy`, `--speculative-draft-load-format dummy`)
and runs them without a tokenizer (`--skip-tokenizer-init`), so `dflashctl smoke` needs no
download. The shapes are the pair that served DFLASH on an H200 (docs/smoke.md). Random weights
accept almost no draft tokens: this pair proves the stack decodes, not how well a real drafter
guesses.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.host import model_pair

# Token id 0 is bos, eos and pad: requests use ignore_eos, so generation always runs to length.
SPECIAL_TOKEN_ID = 0


@dataclass(frozen=True)
class PairShape:
    hidden_size: int = 1024
    intermediate_size: int = 3072
    target_layers: int = 8
    draft_layers: int = 2
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 64
    vocab_size: int = 151936
    max_position_embeddings: int = 8192
    block_size: int = 16  # DFlash block == --speculative-num-draft-tokens
    target_layer_ids: tuple[int, ...] = (1, 5)  # target layers whose hidden states feed the draft
    mask_token_id: int = 151669


def qwen3_config(s, max_position_embeddings: int, rope_theta: float) -> dict:
    """A Qwen3 target's config.json for a shape with PairShape's field names (the oracle pair's too)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.target_layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "vocab_size": s.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "bos_token_id": SPECIAL_TOKEN_ID,
        "eos_token_id": SPECIAL_TOKEN_ID,
        "pad_token_id": SPECIAL_TOKEN_ID,
    }


def dflash_draft_config(s, target: dict) -> dict:
    """The DFlash drafter's config.json over its target's, for a shape with PairShape's field names."""
    return {**target,
            "architectures": ["DFlashDraftModel"],
            "num_hidden_layers": s.draft_layers,
            "block_size": s.block_size,
            "num_target_layers": s.target_layers,
            "dflash_config": {
                "mask_token_id": s.mask_token_id,
                "target_layer_ids": list(s.target_layer_ids),
                "block_size": s.block_size,
            }}


def tp_problems(config: dict, tp: int) -> list[str]:
    """Why SGLang could not shard a model with this config.json over `tp` GPUs; empty when it can.
    Its tensor-parallel layers split the attention heads, the KV heads (or, when there are fewer
    KV heads than GPUs, replicate them: the GPU count a multiple of them) and the MLP's
    intermediate size; the vocabulary is padded to fit, so it needs nothing."""
    if tp <= 1:
        return []
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    out = []
    if heads % tp:
        out.append(f"{heads} attention heads do not divide over {tp} GPUs")
    if kv >= tp and kv % tp or kv < tp and tp % kv:
        out.append(f"{kv} KV heads neither divide over {tp} GPUs nor replicate onto them")
    if config["intermediate_size"] % tp:
        out.append(f"intermediate_size {config['intermediate_size']} does not divide over {tp} GPUs")
    return out


def target_config(s: PairShape) -> dict:
    return qwen3_config(s, s.max_position_embeddings, 1000000.0)


def draft_config(s: PairShape) -> dict:
    return dflash_draft_config(s, target_config(s))


def generation_config() -> dict:
    return {"bos_token_id": SPECIAL_TOKEN_ID, "eos_token_id": SPECIAL_TOKEN_ID,
            "pad_token_id": SPECIAL_TOKEN_ID}


def write_pair(root: Path | str, shape: PairShape = PairShape()) -> tuple[Path, Path]:
    """Write target/ and draft/ under `root`; returns their paths."""
    target, draft = target_config(shape), draft_config(shape)
    problems = [f.line() for f in model_pair.check_target(target, "DFLASH")
                + model_pair.check_pair(target, draft, "DFLASH", shape.block_size, skip_tokenizer_init=True)
                if f.level == model_pair.FAIL]  # the rules serve's preflight holds a real pair to
    if problems:
        raise DflashError("the synthetic model shapes do not fit together", "; ".join(problems),
                          "choose a block size and layer ids within the target")
    root = Path(root)
    paths = []
    for name, cfg in (("target", target), ("draft", draft)):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (d / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
        paths.append(d)
    return paths[0], paths[1]


def shape_for_block(block_size: int) -> PairShape:
    """The default pair with a DFlash block of `block_size` (= --num-draft-tokens)."""
    if block_size < 2:
        raise DflashError(f"--num-draft-tokens {block_size} is too small",
                          "a DFlash block holds the verified token plus at least one draft token",
                          "use 2 or more (16 is the published drafters' block)")
    return PairShape(block_size=block_size)
