"""What one smoke run does, decided before anything is measured (Plan, built once and then only
read), and what the run gathered (Outcome, filled while it runs).

For a local run: which runs (select_runs), the prompts, the models written here (write_models:
the oracle pair, the random pair and its tokenizer, or --model's names), each server's RunSpec,
the acceptance bands the oracle predicts, and how the servers start (memory.decide_launch).
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl.errors import PREFLIGHT_SGLANG, USAGE, DflashError
from dflashctl.smoke import acceptance, loadgen, oracle, sweep, synthetic, tokenizer
from dflashctl.smoke.log import say
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS, ORACLE_KV_TOKENS, RunSpec, synthetic_kv_tokens

SPECULATIVE = ("DFLASH", "DDTREE")
POISONED = "DFLASH-poisoned"  # DFLASH with the oracle pair's poisoned drafter
GRAMMAR_RUN = "grammar"  # the oracle pair has no tokenizer: the grammar phase gets a server of its own


@dataclass(frozen=True)
class Plan:
    runs: tuple[str, ...]  # "baseline", "DFLASH", "DFLASH-poisoned", "DDTREE", in the table's order
    synthetic: bool
    launch: str  # "together", "sequential", or "external" for --url
    prompts: tuple  # token-id lists or texts
    settings: dict  # what the result and each recording name as the run's settings
    grammar: bool = False  # run the grammar phase on each server (grammar.py)
    pair: str | None = None  # "oracle", "random" or "broken" for a synthetic pair, None for --model/--url
    specs: tuple[RunSpec, ...] = ()  # the servers to start (local runs)
    fraction: float | None = None  # memFractionStatic the launch plan chose (None: the flag's or default)
    launch_plan: dict | None = None  # memory.memory_plan's answer
    tokenizer: dict | None = None  # what tokenizer.write built for the synthetic target
    oracle: "oracle.Pair | None" = None  # the oracle pair written (or reused) for this run
    expectations: dict = field(default_factory=dict)  # run -> phase -> acceptance band (acceptance.py)


@dataclass
class Outcome:
    results: list = field(default_factory=list)  # report.RunResult per measured run, in the plan's order
    grammar_servers: list = field(default_factory=list)  # grammar.ServerGrammar per measured server
    models: list = field(default_factory=list)  # the weights loaded (smoke.models_loaded)
    jit_compiled: dict | None = None  # what the JIT caches gained while the servers started
    jit_prewarm: dict | None = None  # what the prewarm helper compiled (jit_prewarm.py), or why not


def algorithm_of(run: str) -> str | None:
    return "DFLASH" if run == POISONED else run if run in SPECULATIVE else None


def _usage(what: str, fix: str) -> DflashError:
    return DflashError(what, "", fix, USAGE)


def select_runs(wanted: str, accepted: set[str], pair: str | None = None) -> list[str]:
    if wanted == "auto":
        runs = ["baseline", "DFLASH"] + ([POISONED] if pair == "oracle" else []) + \
            (["DDTREE"] if "DDTREE" in accepted else [])
    else:
        runs = []
        for w in (x.strip() for x in wanted.split(",") if x.strip()):
            name = {"baseline": "baseline", POISONED.lower(): POISONED}.get(w.lower(), w.upper())
            if name not in ("baseline", POISONED, *SPECULATIVE):
                raise _usage(f"--runs: unknown run {w!r}", f"use baseline, DFLASH, {POISONED} and/or DDTREE")
            if name == POISONED and pair not in ("oracle", "broken"):
                raise _usage(f"--runs {POISONED} needs the oracle pair",
                             "drop --pair random and --model, or drop it from --runs")
            runs.append(name)
    missing = [r for r in runs if r in SPECULATIVE and r not in accepted]
    if missing:
        raise DflashError(f"the installed SGLang does not accept --speculative-algorithm {', '.join(missing)}",
                          f"it accepts {', '.join(sorted(accepted)) or 'nothing (is SGLang installed?)'}",
                          "DDTREE needs a patched SGLang (docs/smoke.md); drop it from --runs", PREFLIGHT_SGLANG)
    return runs


def oracle_shape(o: SmokeOptions, pair: str | None) -> "oracle.OracleShape | None":
    """The oracle pair's shape (None for the random pair and --model); --input-len must cover its rule."""
    if pair not in ("oracle", "broken"):
        return None
    block = o.num_draft_tokens or 16
    shape = oracle.OracleShape(block_size=block, lag=max(15, block - 1),
                               draft_offset_error=-1 if pair == "broken" else 0)
    if o.input_len < shape.lag:
        raise _usage(f"--input-len {o.input_len} is shorter than the oracle's rule looks back ({shape.lag})",
                     f"use --input-len {shape.lag} or more, or --pair random")
    return shape


def local_prompts(o: SmokeOptions, shape) -> list:
    if o.synthetic_pair:
        return loadgen.token_prompts(o.requests, o.input_len, o.seed, shape.hi if shape else 1000)
    return loadgen.text_prompts(o.requests)


@dataclass(frozen=True)
class Models:
    """What write_models put on disk and the servers that load it."""
    specs: list[RunSpec]
    tokenizer: dict | None = None
    oracle: "oracle.Pair | None" = None
    expectations: dict = field(default_factory=dict)


def write_models(o: SmokeOptions, runs: list[str], prompts: list, shape, work: Path, phases: dict) -> Models:
    """The servers to start: one per run, plus the grammar phase's own for the oracle pair."""
    pair = o.synthetic_pair
    if pair is None:
        return Models([RunSpec(r, algorithm_of(r), o.model, o.draft_model, synthetic=False) for r in runs])
    tok = random_target = random_draft = None
    if pair == "random" or o.grammar:
        rshape = synthetic.shape_for_block(o.num_draft_tokens or synthetic.PairShape().block_size)
        random_target, random_draft = (str(p) for p in synthetic.write_pair(work / "models", rshape))
        if o.grammar:  # SGLang runs a grammar backend only with a tokenizer
            tok = tokenizer.write(Path(random_target), rshape.vocab_size)
            phases["tokenizer"] = tok["seconds"]
            say(f"synthetic tokenizer: {tok['vocab_size']} tokens in {tok['seconds']}s")
    if pair == "random":
        tokens = synthetic_kv_tokens(o, DEFAULT_SYNTHETIC_KV_TOKENS, synthetic.PairShape().block_size)
        return Models([RunSpec(r, algorithm_of(r), random_target, random_draft, dummy=True, tokenizer=o.grammar,
                               kv_tokens=tokens) for r in runs], tok)
    return _oracle_models(o, runs, prompts, shape, work, phases, tok, random_target)


def _oracle_models(o: SmokeOptions, runs: list[str], prompts: list, shape, work: Path, phases: dict,
                   tok: dict | None, random_target: str | None) -> Models:
    t = time.monotonic()
    pair = oracle.write_pair(work / "models", shape)
    phases["oracle pair"] = time.monotonic() - t
    say(f"oracle pair {pair.content_hash[:16]} {'reused' if pair.reused else 'written'} in {pair.root} "
        f"({time.monotonic() - t:.1f}s)")
    drafts = {"DFLASH": pair.draft, POISONED: pair.poisoned, "DDTREE": pair.draft}
    tokens = synthetic_kv_tokens(o, ORACLE_KV_TOKENS, shape.block_size)
    specs = [RunSpec(r, algorithm_of(r), str(pair.target), str(drafts[r]) if r in drafts else None,
                     tokenizer=False, kv_tokens=tokens) for r in runs]
    if o.grammar:
        specs.append(RunSpec(GRAMMAR_RUN, None, random_target, dummy=True, tokenizer=True, cuda_graphs=False))
    sweep_phases = {sweep.phase_name(c): sweep.prompt_order(c, prompts, o.sweep_rounds) for c in o.sweep_points}
    expectations = acceptance.expectations(shape, runs, prompts, o.sequential_requests, o.max_new_tokens,
                                           sweep_phases)
    return Models(specs, tok, pair, expectations)


def check_tp(o: SmokeOptions, specs: list[RunSpec]) -> None:
    """--tp-size against the synthetic models' shapes, before any server starts (SGLang would stop
    at its first tensor-parallel layer, after its imports)."""
    problems: dict[str, list[str]] = {}  # problem -> the models that have it
    for sp in specs:
        for path in (sp.target, sp.draft) if sp.synthetic else ():
            if path and (cfg := Path(path, "config.json")).exists():
                for p in synthetic.tp_problems(json.loads(cfg.read_text()), o.tp_size):
                    problems.setdefault(p, [])
                    if Path(path).name not in problems[p]:
                        problems[p].append(Path(path).name)
    if problems:
        raise DflashError(f"--tp-size {o.tp_size}: the synthetic models do not shard over {o.tp_size} GPUs",
                          "; ".join(f"{p} ({', '.join(models)})" for p, models in problems.items()),
                          "use --tp-size 2, 4, 8 or 16", USAGE)


def settings(o: SmokeOptions, runs: list[str], synthetic_pair: bool, launch: str, prompt_kind: str) -> dict:
    """The run's settings as the result and the recordings show them."""
    return {"runs": list(runs), "requests": o.requests, "sequential_requests": o.sequential_requests,
            "max_new_tokens": o.max_new_tokens, "input_len": o.input_len, "seed": o.seed,
            "prompts": prompt_kind, "launch": launch, "wait_all": o.wait_all,
            "jit_prewarm": o.jit_prewarm and launch != "external",
            "synthetic": synthetic_pair, "grammar": o.grammar,
            "ttft": "first streamed chunk carrying a token (client clock)",
            "sweep": list(o.sweep_points), "sweep_rounds": o.sweep_rounds if o.sweep_points else None}
