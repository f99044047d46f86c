"""`dflashctl smoke`: prove that this host serves DFlash (and DDTree where SGLang has it), and how fast.

With no arguments: writes the oracle pair (oracle.py: weights set by hand, so greedy decoding is
known and the drafter is right, or poisoned, right in part; nothing downloaded), starts SGLang
for plain decoding, DFLASH with each drafter and, where the installed SGLang accepts it, DDTREE
-- through the same settings -> argv -> child-process path as `dflashctl serve` -- measures each
with the same prompts and holds acceptance to what the pair must give (acceptance.py); the
grammar phase gets a server of its own. `--pair random` is the random-weight pair of before.
`--model/--draft-model` does the same for a real pair;
`--url` measures a service that already runs. docs/smoke.md explains the choices.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from dflashctl import __version__, cli_help, inputs, output
from dflashctl.cli_help import positive_float, positive_int
from dflashctl.errors import (DRAFTS_REJECTED, FAILED, GRAMMAR_VIOLATION, NOT_LOSSLESS, PREFLIGHT_SGLANG, USAGE,
                              DflashError)
from dflashctl.host import hub_cache, kernels
from dflashctl.service import sglang_features
from dflashctl.smoke import (acceptance, grammar, identity, jit_prewarm, loadgen, oracle, router_info, startup, sweep,
                             synthetic, tokenizer)
from dflashctl.smoke.report import RunResult, summarise, table
from dflashctl.smoke.servers import (SPECULATIVE, Fleet, RunSpec, check_pairs, driver_note, first_start_note,
                                     DEFAULT_SYNTHETIC_KV_TOKENS, free_gpu_mib, kv_tokens, memory_plan, say,
                                     server_demand_mib, smoke_gpu, start_server, stop_all)
# /server_info fields kept in the result (the whole answer holds every server argument).
SERVER_INFO_KEYS = ("version", "model_path", "speculative_algorithm", "speculative_draft_model_path",
                    "speculative_num_draft_tokens", "speculative_ddtree_budget", "attention_backend",
                    "speculative_draft_attention_backend", "cuda_graph_max_bs", "cuda_graph_bs",
                    "disable_cuda_graph", "disable_piecewise_cuda_graph", "mem_fraction_static",
                    "max_running_requests", "skip_tokenizer_init", "load_format", "tp_size",
                    "grammar_backend", "constrained_json_disable_any_whitespace")


def register(subparsers) -> None:
    p = subparsers.add_parser("smoke", help="prove that SGLang serves DFlash here, and how fast",
                              **cli_help.texts("smoke", __doc__))
    what = p.add_argument_group("what to test (default: a synthetic pair started here)")
    what.add_argument("--model", help="target model (repo id or directory); needs --draft-model")
    what.add_argument("--draft-model", help="DFlash drafter for --model, e.g. z-lab/Qwen3-8B-DFlash-b16")
    what.add_argument("--model-revision", metavar="REV",
                      help="hub revision of --model (a commit pins it; the result names the commit loaded)")
    what.add_argument("--draft-model-revision", metavar="REV", help="hub revision of --draft-model")
    what.add_argument("--url", help="measure the service already running at URL instead of starting one")
    what.add_argument("--baseline-url", help="with --url: a plain-decoding service to compare against")
    what.add_argument("--api-key-file", help="with --url: file holding the service's API key")
    what.add_argument("--pair", choices=("oracle", "random", "broken"), default="oracle",
                      help="synthetic pair (no --model): oracle (default) = weights set by hand so that the "
                           "drafter is right (and a poisoned drafter partly right): acceptance, lossless "
                           "decoding with accepted drafts and a speed-up are measured; random = random "
                           "weights (--load-format dummy), the quick path check that accepts nothing; "
                           "broken = the oracle target with a drafter one position off: smoke must fail "
                           "with exit 6 (a check of the check)")
    what.add_argument("--runs", default="auto",
                      help="comma list of baseline, DFLASH, DFLASH-poisoned (oracle pair only), DDTREE "
                           "(default auto: baseline, DFLASH, DFLASH-poisoned with the oracle pair, plus "
                           "DDTREE when the installed SGLang accepts it)")
    what.add_argument("--no-grammar", action="store_true",
                      help="skip the grammar phase (constrained requests checked against their grammars; "
                           "for the synthetic pair it builds a small tokenizer, docs/smoke.md)")
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument("--num-draft-tokens", type=int,
                      help="DFlash block size (default 16 for the synthetic pair, the drafter's own otherwise)")
    spec.add_argument("--ddtree-budget", type=int, help="DDTREE tree budget (default: SGLang's)")
    spec.add_argument("--require-lossless", action="store_true",
                      help="fail (exit 4) when a speculative run's greedy outputs differ from the baseline's "
                           "(always so for the synthetic pair; a warning otherwise)")
    spec.add_argument("--attention-backend",
                      help="attention backend of target and drafter (default triton for the synthetic "
                           "pair: no kernel download or JIT; SGLang's choice otherwise)")
    load = p.add_argument_group("load")
    load.add_argument("--requests", type=int, default=8, help="prompts sent at once in the concurrent phase (8)")
    load.add_argument("--sequential-requests", type=int, default=4,
                      help="prompts sent one at a time in the sequential phase (4)")
    load.add_argument("--max-new-tokens", type=int, default=256, help="tokens decoded per request (256)")
    load.add_argument("--input-len", type=int, default=32, help="token ids per synthetic prompt (32)")
    load.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts (0)")
    load.add_argument("--request-timeout", type=positive_float, default=300, help="seconds per request (300)")
    load.add_argument("--sweep", metavar="C,C,...",
                      help="after the usual phases, measure every run at each of these concurrencies, e.g. "
                           "1,2,4,8,16,32,64: tok/s, speed-up and where DFLASH falls below the baseline "
                           "(docs/smoke.md, 'Concurrency sweep'); the servers get CUDA graphs for each point")
    load.add_argument("--sweep-rounds", type=positive_int, default=2,
                      help="with --sweep: at least this many rounds of C requests per point, every prompt "
                           "equally often (2)")
    start = p.add_argument_group("server start (start-up time; docs/smoke.md)")
    start.add_argument("--launch", choices=("together", "sequential"),
                       help="together: start every server at once on the GPU and measure them in turn "
                            "(default for the synthetic pairs, where SGLang's memory rule allows it in every "
                            "start order; else one at a time); sequential: one server at a time "
                            "(default for --model)")
    start.add_argument("--wait-all", action="store_true",
                       help="with --launch together: measure only once every server is ready (quieter GPU, "
                            "slower; default: measure each server as soon as it is ready)")
    start.add_argument("--max-total-tokens", type=int,
                       help="KV-cache tokens per server (default 32768 oracle pair, 65536 random pair: a "
                            "capped pool makes each server's memory known, so side-by-side starts can be "
                            "planned; 0: SGLang's, and one server at a time)")
    start.add_argument("--mem-fraction-static", type=float,
                       help="per server (default for the synthetic pairs: 0.25 together, or the least "
                            "fraction SGLang's memory rule needs; 0.5 one at a time)")
    start.add_argument("--cuda-graph-max-bs", type=int,
                       help="largest CUDA-graph batch (default 8 for the synthetic pair = --requests)")
    start.add_argument("--cuda-graph-bs", help="explicit CUDA-graph batch sizes, e.g. 1,8 (SGLang's --cuda-graph-bs)")
    start.add_argument("--piecewise-cuda-graph", action="store_true",
                       help="keep SGLang's piecewise prefill graphs (off for the synthetic pair: ~8 s of "
                            "capture that 32-token prompts do not need)")
    start.add_argument("--no-cuda-graph", action="store_true", help="no CUDA graphs at all")
    start.add_argument("--triton-cache", metavar="DIR|none",
                       help="TRITON_CACHE_DIR shared by all servers (default "
                            "$XDG_CACHE_HOME/dflashctl/triton; none: leave the variable alone)")
    start.add_argument("--no-jit-prewarm", dest="jit_prewarm", action="store_false",
                       help="let each server compile SGLang's JIT kernels one by one at first use, as "
                            "before (default: a helper compiles them in parallel while the servers import; "
                            "docs/smoke.md)")
    start.add_argument("--gpu", type=int, help="GPU index for the servers (default: CUDA_VISIBLE_DEVICES as is)")
    start.add_argument("--tp-size", type=positive_int, default=1,
                       help="tensor parallelism: every server on this many GPUs (--gpu, default 0, and the next "
                            "ones; SGLang's --tp-size). The oracle pair's 16 heads and 16 KV heads shard over "
                            "2, 4, 8 or 16 (docs/smoke.md, 'Tensor parallelism')")
    start.add_argument("--python", default=sys.executable, help="interpreter that has SGLang (default: this one)")
    start.add_argument("--start-timeout", type=positive_float, default=600,
                       help="seconds a server may take to be ready (600)")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE|-", help="write the full result as JSON to FILE; '-' prints it "
                                                      "on stdout and moves the table to stderr. Written also "
                                                      "when a run or a server fails: {\"ok\": false, \"failures\": [...]}, "
                                                      "plus \"error\" when a server or the setup failed")
    out.add_argument("--work-dir", help="keep models and server logs here (default: a temp dir, removed)")
    out.add_argument("--lock", metavar="PATH",
                     help="lock whose packages the measured environment is compared with (default: as "
                          "doctor finds it: $DFLASHCTL_LOCK, the lock installed with dflashctl, its checkout's)")
    out.add_argument("--record", metavar="DIR", help="save every response in DIR (replayable by the tests)")
    out.add_argument("--keep-logs", metavar="DIR", help="copy each server's full SGLang log to DIR/<run>.log "
                                                        "(also when smoke fails)")
    p.set_defaults(func=run)


# --- plan -------------------------------------------------------------------------------------------

@dataclass
class Plan:
    runs: list[str]  # "baseline", "DFLASH", "DDTREE"
    synthetic: bool
    launch: str
    prompts: list  # token-id lists or texts
    settings: dict
    jit_compiled: dict | None = None  # what the JIT caches gained while the servers started
    jit_prewarm: dict | None = None  # what the prewarm helper compiled (jit_prewarm.py)
    grammar: bool = False  # run the grammar phase on each server (grammar.py)
    grammar_servers: list = field(default_factory=list)  # grammar.ServerGrammar per measured server
    tokenizer: dict | None = None  # what tokenizer.write built for the synthetic target
    models: list = field(default_factory=list)  # the weights loaded (models_loaded)
    pair: str | None = None  # "oracle", "random" or "broken" for a synthetic pair, None for --model/--url
    oracle: "oracle.Pair | None" = None  # the oracle pair written (or reused) for this run
    expectations: dict = field(default_factory=dict)  # run -> phase -> acceptance band (acceptance.py)
    launch_plan: dict | None = None  # servers.memory_plan's answer


def _usage(what: str, fix: str) -> DflashError:
    return DflashError(what, "", fix, USAGE)


def _check_args(a) -> None:
    for flag, rev, model in (("--model-revision", a.model_revision, a.model),
                             ("--draft-model-revision", a.draft_model_revision, a.draft_model)):
        if rev and not model:
            raise _usage(f"{flag} without {flag.removesuffix('-revision')}",
                         f"pass {flag.removesuffix('-revision')} REPO with it, or drop it")
    if a.url:
        if a.model or a.draft_model:
            raise _usage("--url and --model cannot be combined", "measure a running service with --url, "
                         "or start one here with --model/--draft-model")
    elif bool(a.model) != bool(a.draft_model) and not (a.model and a.runs == "baseline"):
        raise _usage("--model and --draft-model go together",
                     "name both the target and its DFlash drafter, e.g. --model Qwen/Qwen3-8B "
                     "--draft-model z-lab/Qwen3-8B-DFlash-b16")
    if a.baseline_url and not a.url:
        raise _usage("--baseline-url needs --url", "pass the speculative service's --url too")
    if a.api_key_file and not a.url:
        raise _usage("--api-key-file needs --url", "it is the key of the running service --url measures")
    if a.require_lossless and (a.url and not a.baseline_url or not a.url and a.runs != "auto"
                               and "baseline" not in a.runs.lower()):
        raise _usage("--require-lossless needs a baseline to compare with",
                     "add baseline to --runs (or --baseline-url with --url)")
    for name in ("requests", "sequential_requests", "max_new_tokens", "input_len"):
        if getattr(a, name) < (0 if name == "sequential_requests" else 1):
            raise _usage(f"--{name.replace('_', '-')} {getattr(a, name)} is too small", "use a positive number")
    for flag, url in (("--url", a.url), ("--baseline-url", a.baseline_url)):
        if url is not None:
            _check_url(flag, url)
    if a.gpu is not None and a.gpu < 0:
        raise _usage(f"--gpu {a.gpu} is not a GPU index", "pass an index from nvidia-smi (0, 1, ...)")
    a.sweep_points = sweep.parse(a.sweep) if a.sweep else []


def _check_url(flag: str, url: str) -> None:
    parts = urlsplit(url) if url.isprintable() else None
    try:
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:
        port_ok = False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise _usage(f"{flag} {url!r} is not an http(s) URL", f"pass {flag} like http://127.0.0.1:30000")


def _check_outputs(a) -> None:
    """Where results go, before any server starts (output.py): a finished run must not end in an
    error about its result file."""
    if a.json != "-":
        output.check(a.json, "--json")
    for flag, d in (("--work-dir", a.work_dir), ("--keep-logs", a.keep_logs), ("--record", a.record)):
        output.check_dir(d, flag)


POISONED = "DFLASH-poisoned"  # DFLASH with the oracle pair's poisoned drafter
GRAMMAR_RUN = "grammar"  # the oracle pair has no tokenizer: the grammar phase gets a server of its own


def algorithm_of(run: str) -> str | None:
    return "DFLASH" if run == POISONED else run if run in SPECULATIVE else None


def _select_runs(wanted: str, accepted: set[str], pair: str | None = None) -> list[str]:
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


# --- measuring --------------------------------------------------------------------------------------

def measure(run: str, algorithm: str | None, ep: loadgen.Endpoint, plan: Plan, a, watch,
            startup_s: float | None = None, log: str | None = None, throughput: bool = True) -> RunResult:
    """Warm-up, then the sequential and concurrent phases (unless not `throughput`: the grammar
    server), then the grammar phase where the plan has one."""
    result = RunResult(run, algorithm, ep.base_url, startup_s=startup_s, log=log)
    recordings: list | None = [] if a.record else None
    bodies = [loadgen.payload(p, a.max_new_tokens) for p in plan.prompts]
    if throughput:
        _warm_up(run, ep, plan, a, watch)
    if throughput and a.sequential_requests:
        seq = loadgen.run_phase(ep, f"{run} sequential", bodies[:a.sequential_requests], 1,
                                a.request_timeout, watch, say, recordings)
        seq.name = "sequential"
        result.phases.append(seq)
    if throughput:
        conc = loadgen.run_phase(ep, f"{run} concurrent", bodies, len(bodies), a.request_timeout, watch, say,
                                 recordings)
        conc.name = "concurrent"
        result.phases.append(conc)
    if throughput and a.sweep_points:
        result.phases += sweep.run_points(run, ep, plan.prompts, a, watch, say)  # not recorded: the same prompts
    info = router_info.server_info(ep)[0]  # through a router: one healthy worker's
    result.server_info = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or [{}]
    result.server_info["avg_spec_accept_length"] = (states[0] or {}).get("avg_spec_accept_length")
    grammar_recordings: list | None = [] if a.record else None
    if plan.grammar and (run == GRAMMAR_RUN or plan.pair == "random" or not plan.synthetic):
        plan.grammar_servers.append(grammar.check_server(run, algorithm, ep, info, a.request_timeout, watch,
                                                         say, grammar_recordings))
    if a.record:
        _record(Path(a.record) / f"{run}.json", plan, info, recordings, grammar_recordings)
    return result


def _grammar_target(plan: Plan) -> str:
    """Which model the grammar phase ran on (it needs a tokenizer; the oracle pair has none)."""
    if plan.pair in ("oracle", "broken"):
        return ("its own server: the random-weight synthetic target with the 3000-token tokenizer "
                "(the oracle pair has no tokenizer), plain decoding")
    if plan.pair == "random":
        return "every server: the random-weight synthetic pair with the 3000-token tokenizer"
    return "every server: the model's own tokenizer"


def _warm_up(run: str, ep: loadgen.Endpoint, plan: Plan, a, watch) -> None:
    """Each phase once, short (32 new tokens), before it is measured: first-use kernel compiles
    and the first replays of every batch size the phases use land here, not in the figures. The
    same prompts as measured (their 32-token prefill may then come from SGLang's prefix cache:
    decoding, not prefill, is what the figures time)."""
    bodies = [loadgen.payload(p, min(a.max_new_tokens, 32)) for p in plan.prompts]
    say(f"{run}: warm-up ({'1 request, then ' if a.sequential_requests else ''}{len(bodies)} at once)")
    phases = ([(bodies[:1], 1)] if a.sequential_requests else []) + [(bodies, len(bodies))]
    for batch, conc in phases:
        warm = loadgen.run_phase(ep, f"{run} warm-up", batch, conc, a.request_timeout, watch, say)
        failed = [r.error for r in warm.requests if r.error]
        if failed:
            say(f"{run}: warm-up failed: {failed[0]}")


def _record(path: Path, plan: Plan, server_info: dict, recordings: list, grammar_recordings: list) -> None:
    """Each distinct request once (sequential and concurrent send the same prompts)."""
    seen, generate = set(), []
    for rec in recordings:
        key = json.dumps(rec.request, sort_keys=True)
        if key not in seen and rec.final is not None:
            seen.add(key)
            generate.append(asdict(rec))
    path.parent.mkdir(parents=True, exist_ok=True)
    output.write(path, json.dumps({"settings": plan.settings, "server_info": server_info,
                                   "generate": generate, "grammar": grammar_recordings}, indent=1) + "\n",
                 "--record")


# --- the command ------------------------------------------------------------------------------------

def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`: the servers are stopped


def run(a) -> int:
    _check_args(a)
    _check_outputs(a)
    signal.signal(signal.SIGTERM, _terminate)  # `timeout`, systemd: stop our servers too
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    work, ok, probe = None, False, None
    try:
        if a.url:
            results, plan = _run_url(a, phases)
            ident = identity.unknown("--url: the service's host was not probed", dflashctl=__version__,
                                     sglang=results[0].server_info.get("version") if results else None)
        else:
            work = Path(a.work_dir).resolve() if a.work_dir else Path(tempfile.mkdtemp(prefix="dflash-smoke-"))
            probe = identity.Probe(a.python, a.lock)  # in the background, while the servers start
            results, plan = _run_local(a, phases, t0, work)
            ident = probe.identity()
        phases["total"] = time.monotonic() - t0
        rule = _rule(plan, a) if plan.oracle else None
        result = summarise(results, plan.settings, phases, plan.synthetic, a.require_lossless,
                           plan.expectations, rule)
        if a.sweep_points:
            result["sweep"] = sweep.summary(result)
        if plan.oracle:
            result["oracle"] = plan.oracle.to_json()
        if plan.launch_plan:
            result["launch_plan"] = plan.launch_plan
        result["identity"] = ident
        if not a.url:  # the GPUs' health at the start and the end of the run, on this host
            result["gpu_health"] = identity.gpu_health_block(ident, a.python)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            used = a.gpu if a.gpu is not None else int(visible) if visible.isdigit() else None
            sick = identity.health_failures(result["gpu_health"], used)
            result["failures"] += sick
            result["ok"] = result["ok"] and not sick
        result["models"] = plan.models
        if ident and isinstance(ident.get("fingerprint"), dict) and plan.models:
            ident["fingerprint"]["models"] = [m for m in plan.models if m.get("repo_id")]  # for `diff`
        result["jit_compiled"] = plan.jit_compiled
        result["jit_prewarm"] = plan.jit_prewarm
        text = table(result)
        if result.get("sweep"):
            text += "\n\n" + sweep.table(result["sweep"])
        if plan.models and not plan.synthetic:
            text += "\n" + models_line(plan.models)
        if plan.grammar:
            order = plan.runs + [GRAMMAR_RUN]
            servers = sorted(plan.grammar_servers, key=lambda g: order.index(g.run))  # as the runs
            block = grammar.summary(servers, plan.tokenizer)
            block["target"] = _grammar_target(plan)
            grammar.merge(result, block)
            text += "\n\n" + grammar.table(result["grammar"])
        print(text, file=sys.stderr if a.json == "-" else sys.stdout)
        _write_json(a.json, result)
        ok = result["ok"]  # a passing run's work dir (models, logs) is removed, a failing one's kept
        return _exit_code(result)
    except DflashError as e:
        # A result file must never be a stale one from an earlier run, nor missing for a machine
        # that reads it: the error goes into it, with the exit code the command ends with.
        phases["total"] = time.monotonic() - t0
        try:
            _write_json(a.json, {**output.error_object(e), "failures": [e.what],
                                 "phases_s": {k: round(v, 2) for k, v in phases.items()}, "runs": [],
                                 "identity": probe.identity(wait=30) if probe else None})  # which host failed
        except DflashError as written:
            if written is not e:
                say(f"the error could not be written to --json: {written.what}: {written.why}")
        raise
    finally:
        if work is not None and not a.work_dir:
            if ok or not any(work.iterdir()):
                shutil.rmtree(work, ignore_errors=True)  # passed, or failed before writing anything
            else:
                say(f"kept {work} (models, server logs) for a look")


def _rule(plan: Plan, a) -> dict[int, list[int]]:
    """Request index -> the ids the oracle's rule gives: prompt i for the smoke's own phases, prompt
    i mod N for the sweep's (sweep.prompt_order), so every request of every phase is held to it."""
    ids = [oracle.greedy(plan.oracle.shape, p, a.max_new_tokens) for p in plan.prompts]
    most = max([len(ids)] + [sweep.request_count(c, len(ids), a.sweep_rounds) for c in a.sweep_points])
    return {i: ids[i % len(ids)] for i in range(most)}


def _exit_code(result: dict) -> int:
    """0 when all passed; DRAFTS_REJECTED when acceptance outside its band is all that failed;
    NOT_LOSSLESS when differing outputs are all that failed; GRAMMAR_VIOLATION
    when only the grammar phase failed; FAILED when anything else did (or both)."""
    if result["ok"]:
        return 0
    failures = set(result["failures"])
    lossless = set(result.get("lossless_failures") or [])
    rejected = set(result.get("acceptance_failures") or [])
    if rejected and failures <= rejected:
        return DRAFTS_REJECTED
    grammar_failures = set((result.get("grammar") or {}).get("failures", []))
    if lossless and failures <= lossless:
        return NOT_LOSSLESS
    if grammar_failures and failures <= grammar_failures:
        return GRAMMAR_VIOLATION
    return FAILED


def _write_json(dest: str | None, result: dict) -> None:
    """--json FILE writes FILE (whole or not at all); --json - prints on stdout (the table then
    went to stderr)."""
    if dest == "-":
        output.print_json(result)
    elif dest:
        output.write(dest, json.dumps(result, indent=2) + "\n", "--json")
        say(f"result written to {dest}")


def _settings(a, plan_runs, synthetic_pair, launch, prompt_kind) -> dict:
    return {"runs": plan_runs, "requests": a.requests, "sequential_requests": a.sequential_requests,
            "max_new_tokens": a.max_new_tokens, "input_len": a.input_len, "seed": a.seed,
            "prompts": prompt_kind, "launch": launch, "wait_all": bool(getattr(a, "wait_all", False)),
            "jit_prewarm": bool(getattr(a, "jit_prewarm", False)) and launch != "external",
            "synthetic": synthetic_pair, "grammar": not a.no_grammar,
            "ttft": "first streamed chunk carrying a token (client clock)",
            "sweep": a.sweep_points, "sweep_rounds": a.sweep_rounds if a.sweep_points else None}


def _run_url(a, phases) -> tuple[list[RunResult], Plan]:
    key = None
    if a.api_key_file:
        key = inputs.read_text(a.api_key_file, "key file", "pass the file that holds the service's API key",
                               USAGE, 64 << 10).strip()
        if not key or any(c.isspace() for c in key):
            raise DflashError(f"{a.api_key_file} holds no API key", "it is empty or more than one word",
                              "pass --api-key-file the file the service's apiKeyFile names (one line)", USAGE)
    targets = [(a.url, None)] + ([(a.baseline_url, "baseline")] if a.baseline_url else [])
    results, routers = [], []
    plan = None
    for url, forced in reversed(targets):  # the baseline first, as when smoke starts servers
        ep = loadgen.Endpoint(url.rstrip("/"), key)
        info, router = router_info.server_info(ep)
        if router is not None:
            plan_router = {**router, "for": forced or "service"}
            routers.append(plan_router)
            say(f"{url} is a router in front of " + ", ".join(
                f"{w['url']} ({'healthy' if w['healthy'] else 'unhealthy'})" for w in router["workers"]))
        algorithm = None if forced == "baseline" else info.get("speculative_algorithm")
        name = forced or algorithm or "baseline"
        if plan is None:
            tokenizer = not info.get("skip_tokenizer_init", False)
            prompts = (loadgen.text_prompts(a.requests) if tokenizer
                       else loadgen.token_prompts(a.requests, a.input_len, a.seed))
            kind = "text" if tokenizer else "token ids"
            plan = Plan([], False, "external", prompts,
                        _settings(a, [], False, "external", kind), grammar=not a.no_grammar)
        if algorithm is None and forced is None:
            say(f"note: {url} runs without speculative decoding; measuring plain decoding")
        plan.runs.append(name)
        t = time.monotonic()
        results.append(measure(name, algorithm, ep, plan, a, watch=lambda: None))
        phases[f"measure {name}"] = time.monotonic() - t
    plan.settings["runs"] = plan.runs
    if routers:
        plan.settings["routers"] = routers  # the result names each router and its workers
    return results, plan


def _run_local(a, phases, t0, work: Path) -> tuple[list[RunResult], Plan]:
    synthetic_pair = not a.model
    pair = a.pair if synthetic_pair else None
    if pair == "broken" and a.runs == "auto":
        a.runs = "baseline,DFLASH"
    accepted = sglang_features.speculative_algorithms(a.python)
    if not accepted:
        raise DflashError(f"SGLang is not installed for {a.python}",
                          "sglang/srt/server_args.py was not found or has no --speculative-algorithm",
                          "run smoke with the stack's interpreter (nix run .#dflash-smoke), or pass --python",
                          PREFLIGHT_SGLANG)
    runs = _select_runs(a.runs, accepted, pair)
    launch = a.launch or ("together" if synthetic_pair else "sequential")
    shape = oracle.OracleShape(block_size=a.num_draft_tokens or 16, lag=max(15, (a.num_draft_tokens or 16) - 1),
                               draft_offset_error=-1 if pair == "broken" else 0) if pair in ("oracle", "broken") else None
    if shape and a.input_len < shape.lag:
        raise _usage(f"--input-len {a.input_len} is shorter than the oracle's rule looks back ({shape.lag})",
                     f"use --input-len {shape.lag} or more, or --pair random")
    prompts = (loadgen.token_prompts(a.requests, a.input_len, a.seed, shape.hi if shape else 1000)
               if synthetic_pair else loadgen.text_prompts(a.requests))
    plan = Plan(runs, synthetic_pair, launch, prompts,
                _settings(a, runs, synthetic_pair, launch, "token ids" if synthetic_pair else "text"),
                grammar=not a.no_grammar, pair=pair)
    plan.settings["pair"] = pair
    started, prewarm, not_prewarmed = [], None, None
    try:
        specs = _specs(a, plan, runs, work, phases, shape)
        check_pairs(a, specs)  # a real pair: serve's model-pair rules before any server starts
        _check_tp(a, specs)
        say(f"runs: {', '.join(s.run for s in specs)}; launch {launch}; work dir {work}")
        say(driver_note())
        note = first_start_note()
        if note:
            say(note)
        fraction, launch = _launch_plan(a, plan, specs, launch)

        results = []
        jit_since = time.time()
        groups = [specs] if launch == "together" else [[sp] for sp in specs]
        for group in groups:
            t = time.monotonic()
            fleet = Fleet([start_server(a, sp, launch, work, started, fraction) for sp in group], a.start_timeout)
            if prewarm is None and not_prewarmed is None:
                prewarm, not_prewarmed = _start_prewarm(a, specs[0].target, started[0])
            # By default each server is measured as soon as it is ready, while the others still
            # start (their CPU-bound compiling barely touches the GPU); --wait-all waits for all.
            queue = [fleet.next_ready() for _ in group] if a.wait_all else []
            while (s := queue.pop(0) if queue else fleet.next_ready()) is not None:
                phases[f"ready {s.run}"] = time.monotonic() - t
                busy = [o.run for o in fleet.started if o.startup_s is None]
                t_m = time.monotonic()
                result = measure(s.run, s.cfg.speculative.algorithm, loadgen.Endpoint(s.cfg.base_url), plan,
                                 a, watch=fleet.check, startup_s=s.startup_s, log=_log_kept(a, s),
                                 throughput=s.run != GRAMMAR_RUN)
                result.measured_while_starting = busy
                result.startup = _startup_of(s)
                if s.run != GRAMMAR_RUN:
                    results.append(result)
                phases[f"measure {s.run}"] = time.monotonic() - t_m
            if launch == "sequential":
                stop_all(fleet.started)
        results.sort(key=lambda r: runs.index(r.name))
        plan.models = models_loaded(a, specs[0].target, specs[-1].draft, synthetic_pair, started, plan)
        plan.jit_prewarm = prewarm.result() if prewarm else not_prewarmed
        caches = startup.jit_caches(started[0].server.env if started else os.environ, _triton_cache_of(started))
        plan.jit_compiled = startup.compiled_since(caches, jit_since)
        phases["start to table"] = time.monotonic() - t0
        return results, plan
    finally:
        stop_all(started)  # also a dead leader: its group may hold helpers
        if prewarm:
            prewarm.stop()
        _keep_logs(a, started)


def _specs(a, plan: Plan, runs: list[str], work: Path, phases: dict, shape) -> list[RunSpec]:
    """The servers to start: one per run, plus the grammar phase's own for the oracle pair."""
    if not plan.synthetic:
        return [RunSpec(r, algorithm_of(r), a.model, a.draft_model, synthetic=False) for r in runs]
    specs = []
    random_target = None
    if plan.pair == "random" or plan.grammar:
        rshape = synthetic.shape_for_block(a.num_draft_tokens or synthetic.PairShape().block_size)
        random_target, random_draft = (str(p) for p in synthetic.write_pair(work / "models", rshape))
        if plan.grammar:  # SGLang runs a grammar backend only with a tokenizer
            plan.tokenizer = tokenizer.write(Path(random_target), rshape.vocab_size)
            phases["tokenizer"] = plan.tokenizer["seconds"]
            say(f"synthetic tokenizer: {plan.tokenizer['vocab_size']} tokens in {plan.tokenizer['seconds']}s")
    if plan.pair == "random":
        return [RunSpec(r, algorithm_of(r), random_target, random_draft, dummy=True, tokenizer=plan.grammar,
                        kv_tokens=_kv_tokens(a, DEFAULT_SYNTHETIC_KV_TOKENS, synthetic.PairShape().block_size))
                for r in runs]
    t = time.monotonic()
    pair = oracle.write_pair(work / "models", shape)
    phases["oracle pair"] = time.monotonic() - t
    plan.oracle = pair
    say(f"oracle pair {pair.content_hash[:16]} {'reused' if pair.reused else 'written'} in {pair.root} "
        f"({time.monotonic() - t:.1f}s)")
    drafts = {"DFLASH": pair.draft, POISONED: pair.poisoned, "DDTREE": pair.draft}
    for r in runs:
        specs.append(RunSpec(r, algorithm_of(r), str(pair.target), str(drafts[r]) if r in drafts else None,
                             tokenizer=False, kv_tokens=_kv_tokens(a, ORACLE_KV_TOKENS, shape.block_size)))
    if plan.grammar:
        specs.append(RunSpec(GRAMMAR_RUN, None, random_target, dummy=True, tokenizer=True, cuda_graphs=False))
    sweep_phases = {sweep.phase_name(c): sweep.prompt_order(c, plan.prompts, a.sweep_rounds) for c in a.sweep_points}
    plan.expectations = acceptance.expectations(shape, runs, plan.prompts, a.sequential_requests, a.max_new_tokens,
                                                sweep_phases)
    return specs


ORACLE_KV_TOKENS = 32768  # 1 GiB at the oracle target's 16 KV heads; smoke needs ~2.5k tokens


def _check_tp(a, specs: list[RunSpec]) -> None:
    """--tp-size against the synthetic models' shapes, before any server starts (SGLang would stop
    at its first tensor-parallel layer, after its imports)."""
    problems: dict[str, list[str]] = {}  # problem -> the models that have it
    for sp in specs:
        for path in (sp.target, sp.draft) if sp.synthetic else ():
            if path and (cfg := Path(path, "config.json")).exists():
                for p in synthetic.tp_problems(json.loads(cfg.read_text()), a.tp_size):
                    problems.setdefault(p, [])
                    if Path(path).name not in problems[p]:
                        problems[p].append(Path(path).name)
    if problems:
        raise DflashError(f"--tp-size {a.tp_size}: the synthetic models do not shard over {a.tp_size} GPUs",
                          "; ".join(f"{p} ({', '.join(models)})" for p, models in problems.items()),
                          "use --tp-size 2, 4, 8 or 16", USAGE)


def _kv_tokens(a, default: int, block: int) -> int:
    """A synthetic server's KV pool: the default cap, or what the sweep's largest point holds."""
    if not a.sweep_points:
        return default
    return max(default, sweep.kv_tokens_needed(a.sweep_points, a.input_len, a.max_new_tokens, block))


def _launch_plan(a, plan: Plan, specs: list[RunSpec], launch: str) -> tuple[float | None, str]:
    """Servers side by side only where SGLang's memory rule lets every one of them start whatever
    the order in which they measure the GPU (servers.memory_plan); else one at a time."""
    if launch != "together" or not plan.synthetic or len(specs) < 2:
        return None, launch
    fraction = a.mem_fraction_static if a.mem_fraction_static is not None else 0.25
    tokens = {sp.run: kv_tokens(a, sp) for sp in specs}
    if any(t is None for t in tokens.values()):
        plan.launch_plan = {"together": False, "reason": "--max-total-tokens 0: pools are not capped"}
    else:
        demands = [server_demand_mib(sp, tokens[sp.run]) for sp in specs]
        plan.launch_plan = memory_plan(free_gpu_mib(a), demands, fraction)
    lp = plan.launch_plan
    if lp["together"]:
        say(f"memory: {len(specs)} servers side by side at memFractionStatic {lp['fraction']} "
            f"(each needs at most {lp.get('needed_fraction')} of {lp.get('free_mib')} MiB free, whatever "
            "the order they measure the GPU in)")
        plan.settings["launch"] = "together"
        return lp["fraction"] if a.mem_fraction_static is None else None, "together"
    say(f"memory: starting the servers one at a time: {lp['reason']}")
    plan.settings["launch"] = "sequential"
    return None, "sequential"


def models_loaded(a, target: str, draft: str | None, synthetic_pair: bool, started: list,
                  plan: Plan | None = None) -> list[dict]:
    """Which weights the servers loaded: for a hub model, the commit its revision resolved to in the
    cache the servers read (their HF_HOME), so two hosts' results show whether they served the same."""
    if synthetic_pair and plan is not None and plan.oracle is not None:
        out = [{"role": "target", "model": "oracle (weights set by hand, written here)", **plan.oracle.to_json()}]
        if plan.grammar:
            out.append({"role": "grammar target", "model": "synthetic (random weights) with its own tokenizer"})
        return out
    if synthetic_pair:
        return [{"role": "target", "model": "synthetic (random weights, written here)"}]
    env = started[0].server.env if started else dict(os.environ)
    out = []
    for role, model, rev in (("target", target, a.model_revision), ("drafter", draft, a.draft_model_revision)):
        if model is None:
            continue
        if hub_cache.is_local(model):
            out.append({"role": role, "model": model, "local": True})
        else:
            out.append({"role": role, "model": model, **hub_cache.inspect(env, model, rev).to_json()})
    return out


def models_line(models: list[dict]) -> str:
    parts = []
    for m in models:
        if m.get("local"):
            parts.append(f"{m['role']} {m['model']} (local directory)")
        else:
            parts.append(f"{m['role']} {m['model']}@{m.get('revision') or 'main'} -> "
                         f"{m.get('commit') or 'commit unknown (not in the cache)'}")
    return "models: " + "; ".join(parts)


def _start_prewarm(a, target: str, first) -> tuple["jit_prewarm.Prewarm | None", dict | None]:
    """The JIT helper, in the servers' environment, with the target's shapes; or, where it is not
    started, why (the result's jit_prewarm): off, no config.json on this disk (a hub id: no shapes
    to compile for), or nothing to compile (the prebuilt kernels hold every module, and its
    import of torch and SGLang would only slow the servers' own)."""
    if not a.jit_prewarm:
        return None, {"enabled": False, "reason": "--no-jit-prewarm"}
    try:
        cfg = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        say("JIT prewarm skipped: no readable config.json in the target directory")
        return None, {"enabled": False, "reason": "no local config.json"}
    env = first.server.env
    root = env.get(kernels.PREBUILT_ENV)
    cc = (smoke_gpu(a, env) or {}).get("compute_capability") if root else None
    if cc:
        covered, text = kernels.coverage(root, cc, {"target": cfg})
        if covered:
            say(f"JIT prewarm not needed: {root} holds them ({text})")
            return None, {"enabled": False, "covered": True, "reason": f"prebuilt kernels: {text}"}
    say("JIT prewarm: compiling SGLang's JIT kernels in parallel while the servers import")
    return jit_prewarm.Prewarm(a.python, env, jit_prewarm.calls_for(cfg)), None


def _startup_of(s) -> dict | None:
    """Where this server's start-up went, from its own log (startup.py)."""
    try:
        text = s.server.log_path.read_text(errors="replace")
    except OSError:
        return None
    return startup.phases(text, s.launched, s.startup_s)


def _triton_cache_of(started) -> str | None:
    return started[0].cfg.environment.get("TRITON_CACHE_DIR") if started else None


def _log_kept(a, s) -> str | None:
    if a.keep_logs:
        return str(Path(a.keep_logs).resolve() / f"{s.run}.log")
    return str(s.server.log_path) if a.work_dir else None


def _keep_logs(a, started) -> None:
    """Copy each server's full log to --keep-logs DIR (a failed start is when it matters most)."""
    if not a.keep_logs or not started:
        return
    dest = Path(a.keep_logs)
    dest.mkdir(parents=True, exist_ok=True)
    for s in started:
        try:
            shutil.copyfile(s.server.log_path, dest / f"{s.run}.log")
        except OSError as e:
            say(f"could not keep the {s.run} log: {e}")
    say(f"server logs kept in {dest}")
