"""The rules a target and its drafter must meet for SGLang 0.5.11, over their config.json (as dicts).

One rule set for every caller: serve's preflight and `dflashctl validate --models` (through
service/model_check.py, which finds the files) and the smoke's own synthetic pair. Each rule says
which SGLang behaviour it stands for (`sglang`): most mismatches would otherwise show only after
both models' weights had loaded, as an exception, or not at all, as an acceptance length near 1.
File paths in those texts are relative to SGLang's package (`sglang/srt/...`).
"""

from dataclasses import dataclass

from dflashctl.host import sglang_models

FAIL, WARN = "fail", "warn"
DFLASH_FAMILY = ("DFLASH", "DDTREE")  # DDTREE (a patched SGLang) drafts with the same DFlash drafters
DEFAULT_BLOCK = 16  # server_args.py: numDraftTokens unset and no block_size in the drafter
DEFAULT_MASK_TOKEN = "<|MASK|>"  # speculative/dflash_utils.py, when dflash_config has no mask_token
# z-lab's b16 drafters for Qwen3 were trained without thinking traces (their README lists them as
# "non-thinking"; their users report about half the acceptance with thinking on).
NON_THINKING_DRAFTERS = ("Qwen3-4B-DFlash-b16", "Qwen3-8B-DFlash-b16")
# z-lab's published DFlash drafters of some targets (their dflash README), named in the fix.
PUBLISHED_DRAFTERS = {
    "Qwen/Qwen3-4B": "z-lab/Qwen3-4B-DFlash-b16",
    "Qwen/Qwen3-8B": "z-lab/Qwen3-8B-DFlash-b16",
    "meta-llama/Llama-3.1-8B-Instruct": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "openai/gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
    "openai/gpt-oss-120b": "z-lab/gpt-oss-120b-DFlash",
}
BELONGS = "use the drafter trained for this target"


@dataclass(frozen=True)
class Finding:
    rule: str  # a short name: "hidden_size", "target_layer_ids", ...
    level: str  # FAIL | WARN
    text: str  # what is wrong, with both values
    fix: str
    sglang: str  # the SGLang 0.5.11 behaviour this rule stands for

    def line(self) -> str:
        return f"{self.rule}: {self.text} (SGLang 0.5.11: {self.sglang}); fix: {self.fix}"


def text_config(cfg: dict) -> dict:
    """The language model's part of a config (multimodal configs nest it, as SGLang reads it)."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def _int(cfg: dict, key: str):
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def attention_shape(cfg: dict) -> dict:
    """heads, kv heads and head dim with SGLang's defaults (kv heads = heads, head_dim = hidden / heads)."""
    t = text_config(cfg)
    hidden, heads = _int(t, "hidden_size"), _int(t, "num_attention_heads")
    kv = _int(t, "num_key_value_heads") if "num_key_value_heads" in t else heads
    head_dim = _int(t, "head_dim") if t.get("head_dim") is not None else (
        hidden // heads if hidden and heads else None)
    return {"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim}


def architecture(cfg: dict) -> tuple[str | None, list[str]]:
    """(the class SGLang's registry picks, the config's architectures): the first one registered."""
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        return None, []
    known = set(sglang_models.load()["architectures"])
    return next((a for a in archs if a in known), None), archs


def check_target(target: dict, algorithm: str | None) -> list[Finding]:
    """The target alone: an architecture SGLang has, and not a drafter."""
    reg = sglang_models.load()
    picked, archs = architecture(target)
    if not archs:
        return [Finding("architectures", FAIL, "the target's config.json has no architectures list",
                        "use the model's published config.json (it names its class, e.g. Qwen3ForCausalLM)",
                        "configs/model_config.py reads architectures[0] before anything loads")]
    if picked in reg["drafters"]:
        return [Finding("architectures", FAIL, f"the target {picked} is a drafter, not a model to serve",
                        "swap model and draftModel (model is the target, draftModel the drafter)",
                        "models/registry.py would load the drafter class as the served model")]
    if picked is None:
        level = FAIL if algorithm else WARN  # no speculative hook in the Transformers backend
        return [Finding("architectures", level,
                        f"SGLang {reg['sglang']} has no model class for {', '.join(archs)}",
                        "serve a model SGLang supports natively (docs/service.md names how to check), "
                        "or accept the Transformers backend without speculative decoding",
                        "models/registry.py falls back to TransformersForCausalLM, which works only for "
                        "model types transformers knows and has no speculative-decoding hooks")]
    return []


def check_pair(target: dict, draft: dict, algorithm: str = "DFLASH", num_draft_tokens: int | None = None,
               tp_size: int = 1, skip_tokenizer_init: bool = False) -> list[Finding]:
    """Every way `draft` does not fit `target` for `algorithm`; empty when they fit."""
    if algorithm in DFLASH_FAMILY:
        return _dflash(target, draft, num_draft_tokens, tp_size, skip_tokenizer_init)
    if algorithm == "EAGLE3":
        return _eagle3(target, draft)
    return []


def _shape_findings(target: dict, draft: dict, keys, why: str, fix: str) -> list[Finding]:
    t_shape = {"hidden_size": _int(text_config(target), "hidden_size"),
               "vocab_size": _int(text_config(target), "vocab_size"), **attention_shape(target)}
    d_shape = {"hidden_size": _int(text_config(draft), "hidden_size"),
               "vocab_size": _int(text_config(draft), "vocab_size"), **attention_shape(draft)}
    out = []
    for key in keys:
        if d_shape[key] != t_shape[key]:
            out.append(Finding(key, FAIL, f"drafter {d_shape[key]} != target {t_shape[key]}", fix, why[key]))
    return out


def _dflash(target: dict, draft: dict, num_draft_tokens, tp_size, skip_tokenizer_init) -> list[Finding]:
    reg = sglang_models.load()
    out = []
    belongs = BELONGS
    picked, archs = architecture(draft)
    if picked not in reg["dflash_drafters"]:
        hint = ("; it is an EAGLE3 drafter: set speculative.algorithm = \"EAGLE3\""
                if picked in reg["eagle3_drafters"] else "")
        out.append(Finding("architectures", FAIL,
                           f"the drafter's architectures {archs or '(none)'} are not a DFlash drafter "
                           f"({', '.join(reg['dflash_drafters'])}){hint}", belongs,
                           "models/registry.py loads the drafter by its architectures; only DFlashDraftModel "
                           "drafts blocks from the target's hidden states"))
    t_picked, _ = architecture(target)
    if t_picked is not None and t_picked not in reg["dflash_targets"]:
        out.append(Finding("target", FAIL, f"the target {t_picked} has no DFlash hook",
                           "serve a target SGLang drafts for with DFLASH (Qwen3, Llama, ... in "
                           "host/data/sglang-models.json dflash_targets), or no speculative algorithm",
                           "model_executor/model_runner.py raises 'does not implement "
                           "set_dflash_layers_to_capture' after the weights have loaded"))
    out += _shape_findings(target, draft, ("hidden_size", "vocab_size", "num_attention_heads",
                                           "num_key_value_heads", "head_dim"), {
        "hidden_size": "models/dflash.py projects the target's hidden states (fc) and reads the target's "
                       "embeddings: a shape error at the first forward, after both models loaded",
        "vocab_size": "the drafter has no embedding or LM head of its own (models/dflash.py uses the "
                      "target's), so a drafter trained on another vocabulary loads and serves with "
                      "acceptance near 1",
        "num_attention_heads": "the KV pool is sized as if the drafter's layers were the target's "
                               "(model_executor/pool_configurator.py); z-lab's drafters copy their "
                               "target's attention shape, so a difference means another target",
        "num_key_value_heads": "the KV pool is sized as if each drafter layer held the target's KV "
                               "(pool_configurator.py scales the target's cell size by its layers)",
        "head_dim": "the KV pool is sized as if each drafter layer held the target's KV "
                    "(pool_configurator.py scales the target's cell size by its layers)"}, belongs)
    heads, kv = attention_shape(draft)["num_attention_heads"], attention_shape(draft)["num_key_value_heads"]
    if heads and kv and (heads % tp_size or (kv % tp_size if kv >= tp_size else tp_size % kv)):
        out.append(Finding("tpSize", FAIL, f"tpSize {tp_size} does not divide the drafter's {heads} heads / "
                           f"{kv} KV heads", "choose a tpSize that divides both",
                           "models/dflash.py asserts it when the drafter is built"))
    out += _dflash_config(target, draft, num_draft_tokens, skip_tokenizer_init)
    t = text_config(draft)
    if t.get("hidden_act", "silu") != "silu":
        out.append(Finding("hidden_act", FAIL, f"the drafter's hidden_act is {t.get('hidden_act')!r}", belongs,
                           "models/dflash.py supports only silu"))
    if not (_int(t, "intermediate_size") or 0) > 0:
        out.append(Finding("intermediate_size", FAIL, "the drafter's intermediate_size is missing or not "
                           "positive", belongs, "models/dflash.py refuses it when the drafter is built"))
    return out


def dflash_fields(draft: dict) -> dict:
    """dflash_config's fields where SGLang reads them (dflash_utils.parse_dflash_draft_config):
    dflash_config first, then the config's top level."""
    dc = draft.get("dflash_config") if isinstance(draft.get("dflash_config"), dict) else {}
    def get(key):
        return dc.get(key, draft.get(key)) if key != "mask_token_id" else dc.get(key)
    return {"target_layer_ids": get("target_layer_ids"), "block_size": get("block_size"),
            "num_target_layers": get("num_target_layers"), "mask_token_id": get("mask_token_id"),
            "mask_token": dc.get("mask_token") or DEFAULT_MASK_TOKEN,
            "top_block_size": draft.get("block_size"), "config_block_size": dc.get("block_size")}


def _dflash_config(target: dict, draft: dict, num_draft_tokens, skip_tokenizer_init) -> list[Finding]:
    out = []
    f = dflash_fields(draft)
    n = _int(text_config(target), "num_hidden_layers")
    draft_layers = _int(text_config(draft), "num_hidden_layers")
    belongs = BELONGS
    if not draft_layers or draft_layers < 1:
        out.append(Finding("num_hidden_layers", FAIL, "the drafter's num_hidden_layers is missing",
                           belongs, "speculative/dflash_utils.py requires it"))
    if not n:
        out.append(Finding("num_hidden_layers", FAIL, "the target's num_hidden_layers is missing",
                           "use the target's published config.json",
                           "model_executor/model_runner.py requires it to pick the layers to capture"))
        return out
    ids = f["target_layer_ids"]
    if ids is None:
        if draft_layers and draft_layers > 1 and n < 4:
            out.append(Finding("target_layer_ids", FAIL, f"the drafter names no target_layer_ids and the "
                               f"target has {n} layers", belongs,
                               "dflash_utils.build_target_layer_ids needs at least 4 target layers"))
    elif (not isinstance(ids, list) or not ids
          or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        out.append(Finding("target_layer_ids", FAIL, f"dflash_config.target_layer_ids {ids!r} is not a "
                           "non-empty list of integers", belongs, "dflash_utils.py refuses it at start"))
    else:
        past = [i for i in ids if not 0 <= i < n]
        last = [i for i in ids if i == n - 1]
        if past:
            out.append(Finding("target_layer_ids", FAIL, f"{ids} name layer(s) {past} outside the target's "
                               f"{n} layers (0..{n - 1})", belongs,
                               "dflash_utils.resolve_target_layer_ids raises when the target starts"))
        elif last:
            out.append(Finding("target_layer_ids", FAIL, f"{ids} name the target's last layer {n - 1}",
                               belongs, "the target records layer k's output at the input of layer k + 1 "
                               "(layers_to_capture = id + 1 in models/llama.py, qwen2.py, gpt_oss.py), so "
                               "the last layer is never captured and the first forward fails on the feature "
                               "size (qwen3_moe.py indexes a layer past the last one)"))
    trained = f["num_target_layers"]
    if trained is not None and trained != n:
        out.append(Finding("num_target_layers", FAIL, f"the drafter was trained on a target with {trained} "
                           f"layers, this target has {n}", belongs,
                           "model_executor/model_runner.py only warns and captures this target's layers, "
                           "which the drafter never saw: acceptance near 1"))
    out += _mask_token(target, f, skip_tokenizer_init)
    out += _block_size(f, num_draft_tokens)
    return out


def _mask_token(target: dict, f: dict, skip_tokenizer_init: bool) -> list[Finding]:
    vocab = _int(text_config(target), "vocab_size")
    mask = f["mask_token_id"]
    if mask is None:
        if skip_tokenizer_init:
            return [Finding("mask_token_id", FAIL, "the drafter names no dflash_config.mask_token_id and "
                            "skipTokenizerInit is set", "set skipTokenizerInit = false, or use a drafter with "
                            "a mask_token_id", "speculative/dflash_worker.py resolves the mask token through "
                            "the tokenizer and raises without one")]
        return []  # resolved through the tokenizer: checked with the tokenizer files (model_check)
    if not isinstance(mask, int) or isinstance(mask, bool) or mask < 0:
        return [Finding("mask_token_id", FAIL, f"dflash_config.mask_token_id {mask!r} is not a "
                        "non-negative integer", "use the drafter's published config.json",
                        "speculative/dflash_utils.py refuses it")]
    if vocab is not None and mask >= vocab:
        return [Finding("mask_token_id", FAIL, f"{mask} is outside the target's vocabulary of {vocab}",
                        BELONGS, "speculative/dflash_worker.py raises after the target's weights have loaded "
                        "(it cannot grow the target's embeddings)")]
    return []


def _block_size(f: dict, num_draft_tokens) -> list[Finding]:
    out = []
    block = f["block_size"]
    if f["top_block_size"] is not None and f["config_block_size"] is not None \
            and f["top_block_size"] != f["config_block_size"]:
        out.append(Finding("block_size", WARN, f"the drafter's block_size {f['top_block_size']} differs from "
                           f"its dflash_config.block_size {f['config_block_size']}",
                           "nothing to change here: SGLang uses dflash_config's",
                           "dflash_utils.parse_dflash_draft_config reads dflash_config first"))
    if num_draft_tokens is None or block is None or num_draft_tokens == block:
        return out
    text = f"speculative.numDraftTokens {num_draft_tokens} != the drafter's block_size {block}"
    fix = f"set speculative.numDraftTokens = {block}, or null (SGLang then takes the drafter's block_size)"
    sglang = ("speculative/dflash_worker.py only logs a warning and drafts numDraftTokens positions with a "
              "drafter trained on blocks of block_size")
    out.append(Finding("numDraftTokens", FAIL if num_draft_tokens > block else WARN,
                       text + (": positions the drafter was never trained on" if num_draft_tokens > block
                               else ": fewer tokens per step than the drafter can propose"), fix, sglang))
    return out


def _eagle3(target: dict, draft: dict) -> list[Finding]:
    reg = sglang_models.load()
    out = []
    belongs = "use the EAGLE3 drafter trained for this target"
    picked, archs = architecture(draft)
    if picked not in reg["eagle3_drafters"]:
        hint = ("; it is a DFlash drafter: set speculative.algorithm = \"DFLASH\""
                if picked in reg["dflash_drafters"] else "")
        out.append(Finding("architectures", FAIL, f"the drafter's architectures {archs or '(none)'} are "
                           f"not an EAGLE3 drafter ({', '.join(reg['eagle3_drafters'])}){hint}", belongs,
                           "models/registry.py loads the drafter by its architectures"))
    t_picked, _ = architecture(target)
    if t_picked is not None and t_picked not in reg["eagle3_targets"]:
        out.append(Finding("target", FAIL, f"the target {t_picked} has no EAGLE3 hook",
                           "serve a target with EAGLE3 support (host/data/sglang-models.json eagle3_targets)",
                           "model_executor/model_runner.py calls set_eagle3_layers_to_capture after the "
                           "weights have loaded"))
    t, d = text_config(target), text_config(draft)
    if _int(d, "num_hidden_layers") != 1:
        out.append(Finding("num_hidden_layers", FAIL, f"the drafter has {d.get('num_hidden_layers')} layers",
                           belongs, "models/llama_eagle3.py supports exactly 1 layer"))
    hidden = _int(t, "hidden_size")
    for key in ("hidden_size", "target_hidden_size"):
        if key in d and d.get(key) != hidden:
            out.append(Finding(key, FAIL, f"drafter {d.get(key)} != target hidden_size {hidden}", belongs,
                               "models/llama_eagle3.py reads the target's embeddings and 3 of its hidden "
                               "states (fc: 3 x target_hidden_size, else hidden_size)"))
    n = _int(t, "num_hidden_layers")
    eagle = draft.get("eagle_config") if isinstance(draft.get("eagle_config"), dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and n:
        bad = (not isinstance(ids, list) or len(ids) != 3
               or not all(isinstance(i, int) and 0 <= i < n - 1 for i in ids))
        if bad:
            out.append(Finding("eagle_aux_hidden_state_layer_ids", FAIL, f"{ids!r} are not 3 layer ids below "
                               f"the target's last layer ({n - 1})", belongs,
                               "the target records layer k's output at the input of layer k + 1 and the "
                               "drafter's fc takes exactly 3 of them"))
    return out


def drafter_for(model: str) -> str | None:
    """z-lab's published DFlash drafter for `model` (a repo id, or a directory named after one)."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for target, drafter in PUBLISHED_DRAFTERS.items():
        short = target.split("/")[1].lower()
        if model.lower() == target.lower() or name == short or name.endswith("-" + short):
            return drafter
    return None


def thinking_finding(chat_template: str | None, draft_name: str) -> Finding | None:
    """A chat template that thinks by default in front of a drafter trained without thinking."""
    if not chat_template or "enable_thinking" not in chat_template or "<think>" not in chat_template:
        return None
    if not any(n.lower() in draft_name.lower() for n in NON_THINKING_DRAFTERS):
        return None
    return Finding("thinking", WARN, f"the target's chat template thinks unless enable_thinking is false, "
                   f"and {draft_name} was trained without thinking (about half the acceptance with it on)",
                   'per request: "chat_template_kwargs": {"enable_thinking": false} in /v1/chat/completions; '
                   'by default: extraArgs = ["--chat-template", "<a copy of the template whose '
                   'enable_thinking defaults to false>"]',
                   "entrypoints/openai/serving_chat.py passes chat_template_kwargs to the template")
