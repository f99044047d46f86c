"""An instance's target and drafter checked as SGLang will load them, before any weights load.

The files are read where the instance's SGLang reads them (host/model_files.py: a local directory,
or the hub cache at the pinned revision; never the hub), and held to one rule set
(host/model_pair.py). serve's preflight runs this with the GPUs' memory at hand; `dflashctl
validate --models` runs it at build time, where the NixOS module's models are store paths.

A hub model an online host has not fetched yet is not checked: the check says so and names `models
fetch`, which puts the files where SGLang reads them, verified, so the next start (or `validate
--models`) checks them before any weights load. Fetching its config here instead would make each
start depend on the hub answering, from an interpreter that need not have the hub client.
"""

import dataclasses

from dflashctl.errors import PREFLIGHT_MODEL_MISSING, PREFLIGHT_MODEL_PAIR
from dflashctl.host import gpus, model_files, model_pair, probes
from dflashctl.host.model_files import ModelFileError
from dflashctl.service import gpu_claim, sglang_args
from dflashctl.service.config import InstanceConfig

NAME = "models"  # every check here is named "models: <what>"


def _check(f: model_pair.Finding, code: int = PREFLIGHT_MODEL_PAIR) -> probes.Check:
    summary = f"{f.text} (SGLang 0.5.11: {f.sglang})"
    if f.level == model_pair.FAIL:
        return probes.fail(f"{NAME}: {f.rule}", summary, f.fix, code)
    return probes.warn(f"{NAME}: {f.rule}", summary, f.fix)


def _fail(rule: str, text: str, fix: str, code: int = PREFLIGHT_MODEL_PAIR) -> probes.Check:
    return probes.fail(f"{NAME}: {rule}", text, fix, code)


def _tokenizer_path(cfg: InstanceConfig) -> str | None:
    """`--tokenizer-path` in extraArgs (SGLang then reads the tokenizer there, not beside the model)."""
    args = list(cfg.extra_args)
    for i, a in enumerate(args):
        if a == "--tokenizer-path" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--tokenizer-path="):
            return a.split("=", 1)[1]
    return None


@dataclasses.dataclass
class Result:
    checks: list  # probes.Check, in the order found
    weight_bytes: int = 0  # target + drafter on disk, where known (for the memory check)


def check(cfg: InstanceConfig, env: dict[str, str], settings_path: str = "<the settings file>") -> Result:
    """Every model problem of `cfg` that its files show, as preflight checks (nothing raised)."""
    fetch = f"dflashctl models fetch --config {settings_path}"
    out = Result([])
    target, t_cfg = _read(cfg.model, cfg.model_revision, "model", cfg, env, fetch, out)
    if t_cfg is None:
        return out
    out.checks += [_check(f) for f in model_pair.check_target(t_cfg, cfg.speculative.algorithm)]
    t_tok = _target_tokenizer(cfg, target, env, out)
    _weights(target, cfg.load_format, "model", out)
    algo = cfg.speculative.algorithm
    if algo is None or cfg.draft_model is None:
        _summary(out, f"target {model_pair.architecture(t_cfg)[0] or '?'} read from {target.where}")
        return out
    draft, d_cfg = _read(cfg.draft_model, cfg.draft_model_revision, "draftModel", cfg, env, fetch, out)
    if d_cfg is None:
        return out
    out.checks += [_check(f) for f in model_pair.check_pair(
        t_cfg, d_cfg, algo, cfg.speculative.num_draft_tokens, cfg.tp_size, cfg.skip_tokenizer_init)]
    d_tok = _safe(lambda: model_files.tokenizer(draft.root), "draftModel tokenizer", out)
    if t_tok is not None and d_tok is not None:
        out.checks += _same_tokenizer(t_tok, d_tok)
        if algo in model_pair.DFLASH_FAMILY:
            out.checks += _mask_by_tokenizer(t_cfg, d_cfg, t_tok)
        template = _safe(lambda: model_files.chat_template(t_tok), "chat template", out)
        thinking = model_pair.thinking_finding(template, cfg.draft_model)
        if thinking:
            out.checks.append(_check(thinking))
    _weights(draft, cfg.draft_load_format, "draftModel", out)
    _name_the_drafter(out, cfg)
    _summary(out, f"target {model_pair.architecture(t_cfg)[0] or '?'} ({target.where}) and drafter "
                  f"{model_pair.architecture(d_cfg)[0] or '?'} ({draft.where})")
    return out


def _name_the_drafter(out: Result, cfg: InstanceConfig) -> None:
    """'use the drafter trained for this target' names it where z-lab publishes one."""
    drafter = model_pair.drafter_for(cfg.model)
    if drafter is None or drafter == cfg.draft_model:
        return
    for c in out.checks:
        if c.fix.startswith(model_pair.BELONGS) and drafter not in c.fix:
            c.fix = c.fix.replace(model_pair.BELONGS, f"{model_pair.BELONGS}: {drafter}", 1)


def _summary(out: Result, what: str) -> None:
    if not any(c.status == "fail" for c in out.checks):
        out.checks.insert(0, probes.ok(f"{NAME}: pair", f"{what}: every rule holds"))


def _safe(read, what: str, out: Result):
    try:
        return read()
    except ModelFileError as e:
        out.checks.append(_fail(what, f"{e.what}: {e.why}",
                                "replace the file with the model's published one (`dflashctl models fetch` "
                                "verifies hub files against the hub's hashes)"))
        return None


def _read(model: str, revision, option: str, cfg: InstanceConfig, env, fetch: str, out: Result):
    """(Located, config dict) or (Located, None) with the reason in out.checks."""
    loc = model_files.locate(model, revision, env)
    partial = not loc.is_local and loc.root is not None and not (loc.root / "config.json").exists()
    if loc.root is None or (partial and not cfg.offline):  # (offline and partial: named below)
        if loc.is_local:
            out.checks.append(_fail(f"{option}", f"{model} is not a directory on this host",
                                    f"create it or point {option} at the model's directory",
                                    PREFLIGHT_MODEL_MISSING))
        elif cfg.offline:
            out.checks.append(_fail(f"{option}", f"{model}@{revision or 'main'} is not in the cache "
                                    f"({loc.where}) and offline is set", fetch, PREFLIGHT_MODEL_MISSING))
        else:
            out.checks.append(probes.warn(
                f"{NAME}: {option}", f"{model}@{revision or 'main'} is not {'whole ' if partial else ''}in the "
                f"cache yet ({loc.where}): SGLang downloads it at this start, so its files are checked only "
                "at the next one", f"{fetch} (the files are then checked before any weights load)",
                unchecked=f"{model}@{revision or 'main'}"))
        return loc, None
    try:
        return loc, model_files.config(loc)
    except ModelFileError as e:
        fix = (f"{fetch} (it verifies each file against the hub's hashes)" if not loc.is_local
               else f"put the model's published config.json into {loc.root}")
        out.checks.append(_fail(f"{option} config", f"{e.what}: {e.why}", fix))
        return loc, None


def _target_tokenizer(cfg: InstanceConfig, target, env, out: Result):
    other = _tokenizer_path(cfg)
    if other is not None:
        loc = model_files.locate(other, None, env)
        if loc.root is None:
            return None  # a hub tokenizer repo, not fetched: SGLang downloads it
        root = loc.root
    else:
        root = target.root
    tok = _safe(lambda: model_files.tokenizer(root), "model tokenizer", out)
    if tok is not None and not tok.vocabulary_files and not cfg.skip_tokenizer_init:
        out.checks.append(_fail("tokenizer", f"{root} has no tokenizer files ("
                                f"{', '.join(model_files.VOCABULARY_FILES[:3])}); SGLang loads the "
                                "tokenizer from the model's directory at start",
                                "use the model's directory with its tokenizer, set extraArgs "
                                "[\"--tokenizer-path\", DIR], or skipTokenizerInit = true (then /generate "
                                "takes input_ids and the OpenAI routes cannot serve text)"))
    return tok


def _same_tokenizer(t_tok, d_tok) -> list:
    """SGLang tokenizes for both models with the target's tokenizer (the draft worker skips its own):
    a drafter shipping another vocabulary was trained on other token ids."""
    common = sorted(t_tok.vocabulary_files & d_tok.vocabulary_files)
    if not d_tok.vocabulary_files:
        return []  # z-lab's drafters ship no tokenizer: the target's is theirs
    differ = [f for f in common if t_tok.files[f] != d_tok.files[f]]
    settings = sorted(f for f in set(t_tok.files) & set(d_tok.files)
                      if f not in model_files.VOCABULARY_FILES and t_tok.files[f] != d_tok.files[f])
    if not common:
        return [probes.warn(f"{NAME}: tokenizer", "the drafter ships tokenizer files of another kind ("
                            f"{', '.join(sorted(d_tok.vocabulary_files))}) than the target "
                            f"({', '.join(sorted(t_tok.vocabulary_files)) or 'none'}): not compared",
                            "make sure the drafter was trained with the target's tokenizer")]
    if not differ:
        if settings:
            return [probes.warn(f"{NAME}: tokenizer", f"same vocabulary; {', '.join(settings)} differ "
                                "(special tokens or chat template): SGLang uses the target's",
                                "nothing to change unless the drafter needs its own chat template")]
        return []
    diff = _vocabulary_difference(t_tok, d_tok)
    if diff is None and "tokenizer.json" in differ:
        return [probes.warn(f"{NAME}: tokenizer", "tokenizer.json differs but maps every token id to the "
                            "same text (normalizer or settings differ)", "nothing to change")]
    return [_fail("tokenizer", f"the drafter's tokenizer is not the target's: {', '.join(differ)} differ"
                  + (f"; {diff}" if diff else "") + " (SGLang 0.5.11 tokenizes for the drafter with the "
                  "target's tokenizer, so the drafter proposes ids of another vocabulary: acceptance near 1)",
                  model_pair.BELONGS)]


def _vocabulary_difference(t_tok, d_tok) -> str | None:
    """The first ids the two tokenizer.json files map differently, or None when none differ."""
    try:
        a, b = model_files.vocabulary(t_tok), model_files.vocabulary(d_tok)
    except ModelFileError as e:
        return f"{e.what}: {e.why}"
    if a is None or b is None:
        return "the vocabularies could not be compared"
    ids = sorted(i for i in set(a) | set(b) if a.get(i) != b.get(i))
    if not ids:
        return None
    first = ids[0]
    return (f"{len(ids)} token ids differ, the first {first}: {a.get(first)!r} in the target, "
            f"{b.get(first)!r} in the drafter")


def _mask_by_tokenizer(t_cfg: dict, d_cfg: dict, t_tok) -> list:
    """SGLang resolves the DFlash mask token with the target's tokenizer (dflash_worker.py)."""
    f = model_pair.dflash_fields(d_cfg)
    try:
        vocab = model_files.vocabulary(t_tok)
    except ModelFileError:
        return []  # named by the tokenizer rules
    if vocab is None:
        return []
    by_text = {t: i for i, t in vocab.items()}
    in_vocab = by_text.get(f["mask_token"])
    size = model_pair.text_config(t_cfg).get("vocab_size")
    if f["mask_token_id"] is not None:
        if in_vocab is not None and in_vocab != f["mask_token_id"]:
            return [_fail("mask_token_id", f"dflash_config.mask_token_id {f['mask_token_id']} but the "
                          f"target's tokenizer has {f['mask_token']!r} at {in_vocab} (SGLang 0.5.11: "
                          "speculative/dflash_worker.py refuses the conflict after the weights loaded)",
                          model_pair.BELONGS)]
        return []
    added_at = in_vocab if in_vocab is not None else (max(vocab) + 1 if vocab else 0)
    if isinstance(size, int) and added_at >= size:
        return [_fail("mask_token_id", f"the drafter names no mask_token_id, and {f['mask_token']!r} is not in "
                      f"the target's tokenizer: SGLang would add it at id {added_at}, outside the vocabulary "
                      f"of {size} (SGLang 0.5.11: speculative/dflash_worker.py raises after the weights "
                      "loaded)", model_pair.BELONGS)]
    return []


def _weights(loc, load_format: str | None, option: str, out: Result) -> None:
    """Weights missing or partial where SGLang will read them; their size for the memory check."""
    if load_format == "dummy" or loc.root is None:
        return
    w = _safe(lambda: model_files.weights(loc), f"{option} weights", out)
    if w is None:
        return
    out.weight_bytes += w.total_bytes or 0
    if not w.missing:
        return
    shown = ", ".join(w.missing[:4]) + (f" and {len(w.missing) - 4} more" if len(w.missing) > 4 else "")
    if loc.is_local:
        out.checks.append(_fail(f"{option} weights", f"{loc.root} lacks weight files: {shown} (SGLang "
                                "fails when it reaches them, after loading the rest)",
                                f"copy the missing files into {loc.root}", PREFLIGHT_MODEL_MISSING))
    else:  # offline hosts are refused before this (serve.check_models_cached); online SGLang downloads
        out.checks.append(probes.warn(f"{NAME}: {option} weights", f"{loc.model} is partial in the cache "
                                      f"({shown}): SGLang downloads the rest at this start",
                                      "dflashctl models fetch --config <the settings file> ahead of the start"))


def memory_check(cfg: InstanceConfig, weight_bytes: int, snapshot: dict,
                 indices: list[int]) -> probes.Check | None:
    """Weights alone larger than what SGLang may use on each GPU (memFractionStatic x its memory)."""
    if not weight_bytes or not snapshot.get("gpus"):
        return None
    chosen = [g for g in snapshot["gpus"] if g["index"] in indices] or snapshot["gpus"][:1]
    total_mib = min(g["memory_mib"]["total"] for g in chosen)
    fraction, how = gpu_claim.claimed_fraction(cfg, snapshot, [g["index"] for g in chosen])
    per_gpu_gib = weight_bytes / cfg.tp_size / 2**30
    budget_gib = fraction * total_mib / 1024
    if per_gpu_gib <= budget_gib:
        return None
    return probes.warn(f"{NAME}: memory", f"the weights alone are {per_gpu_gib:.1f} GiB per GPU (tpSize "
                       f"{cfg.tp_size}), more than SGLang may use: {how} x {total_mib / 1024:.1f} GiB = "
                       f"{budget_gib:.1f} GiB (SGLang 0.5.11 stops with 'Not enough memory' or runs out "
                       "of memory after loading)", "raise memFractionStatic, raise tpSize (more GPUs), or "
                       "serve a smaller or quantized model")


def memory_checks(cfg: InstanceConfig, weight_bytes: int, python: str, env: dict[str, str]) -> list:
    """memory_check with this host's GPUs (NVML, or a recording being replayed)."""
    if not weight_bytes:
        return []
    result = gpus.read(python, gpus.LIBRARY, 20.0, env)
    if not result.get("ok"):
        return []  # the gpu-memory check names NVML's failure
    found = memory_check(cfg, weight_bytes, result["facts"], gpu_claim.instance_gpus(cfg, env))
    return [found] if found else []


def as_lines(checks: list) -> tuple[list[str], list[str]]:
    """(failures, warnings) as `validate` prints them."""
    lines = {s: [f"{c.name}: {c.summary}" + (f"; fix: {c.fix}" if c.fix else "") for c in checks
                 if c.status == s] for s in ("fail", "warn")}
    return lines["fail"], lines["warn"]


def drafter_block_size(cfg: InstanceConfig) -> int | None:
    """The DFlash drafter's block size as SGLang 0.5.11 reads it (dflash_config.block_size, else the
    config's top level), from its files where the unit's SGLang reads them; None when they are not
    on this host or do not say."""
    if cfg.draft_model is None:
        return None
    try:
        loc = model_files.locate(cfg.draft_model, cfg.draft_model_revision, sglang_args.cache_env(cfg))
        block = model_pair.dflash_fields(model_files.config(loc))["block_size"]
    except (ModelFileError, OSError):
        return None
    return block if isinstance(block, int) and not isinstance(block, bool) and block > 0 else None
