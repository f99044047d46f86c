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
from pathlib import Path

from dflashctl import __version__, cli_help, inputs, output
from dflashctl.cli_help import positive_float, positive_int
from dflashctl.errors import DRAFTS_REJECTED, FAILED, GRAMMAR_VIOLATION, NOT_LOSSLESS, PREFLIGHT_SGLANG, USAGE, DflashError
from dflashctl.host import hub_cache, kernels
from dflashctl.service import sglang_features
from dflashctl.smoke import grammar, identity, jit_prewarm, loadgen, memory, options, oracle, router_info, startup, sweep
from dflashctl.smoke.fleet import Fleet, Started, start_server, stop_all
from dflashctl.smoke.log import driver_note, first_start_note, say
from dflashctl.smoke.measure import measure
from dflashctl.smoke.options import SmokeOptions
from dflashctl.smoke.plan import (GRAMMAR_RUN, Outcome, Plan, check_tp, local_prompts, oracle_shape, select_runs,
                                  write_models)
from dflashctl.smoke.plan import settings as run_settings
from dflashctl.smoke.report import summarise, table
from dflashctl.smoke.settings import check_pairs


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
    start.add_argument("--fast-start", dest="fast_start", action="store_true", default=None,
                       help="fork SGLang's scheduler and detokenizer from a template that imported their "
                            "libraries beside the server (the instance setting fastStart = true; default: "
                            "as the setting's default, on at --tp-size 1 and off above; docs/smoke.md)")
    start.add_argument("--no-fast-start", dest="fast_start", action="store_false",
                       help="spawn them as SGLang does (fastStart = false)")
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



# --- the command ------------------------------------------------------------------------------------

def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`: the servers are stopped


def run(args) -> int:
    o = options.from_args(args)
    signal.signal(signal.SIGTERM, _terminate)  # `timeout`, systemd: stop our servers too
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    work, ok, probe = None, False, None
    try:
        if o.url:
            plan, outcome = _run_url(o, phases)
            ident = identity.unknown("--url: the service's host was not probed", dflashctl=__version__,
                                     sglang=outcome.results[0].server_info.get("version") if outcome.results else None)
        else:
            work = Path(o.work_dir).resolve() if o.work_dir else Path(tempfile.mkdtemp(prefix="dflash-smoke-"))
            probe = identity.Probe(o.python, o.lock)  # in the background, while the servers start
            plan, outcome = _run_local(o, phases, t0, work)
            ident = probe.identity()
        phases["total"] = time.monotonic() - t0
        result = _result(o, plan, outcome, phases, ident)
        print(_text(plan, outcome, result), file=sys.stderr if o.json == "-" else sys.stdout)
        _write_json(o.json, result)
        ok = result["ok"]  # a passing run's work dir (models, logs) is removed, a failing one's kept
        return _exit_code(result)
    except DflashError as e:
        phases["total"] = time.monotonic() - t0
        _write_error(o.json, e, phases, probe)
        raise
    finally:
        if work is not None and not o.work_dir:
            if ok or not any(work.iterdir()):
                shutil.rmtree(work, ignore_errors=True)  # passed, or failed before writing anything
            else:
                say(f"kept {work} (models, server logs) for a look")


def _write_error(dest: str | None, e: DflashError, phases: dict, probe) -> None:
    """A result file must never be a stale one from an earlier run, nor missing for a machine that
    reads it: the error goes into it, with the exit code the command ends with."""
    try:
        _write_json(dest, {**output.error_object(e), "failures": [e.what],
                           "phases_s": {k: round(v, 2) for k, v in phases.items()}, "runs": [],
                           "identity": probe.identity(wait=30) if probe else None})  # which host failed
    except DflashError as written:
        if written is not e:
            say(f"the error could not be written to --json: {written.what}: {written.why}")


def _result(o: SmokeOptions, plan: Plan, outcome: Outcome, phases: dict, ident: dict | None) -> dict:
    """The result JSON (without the grammar block, which _text adds)."""
    rule = _rule(plan, o) if plan.oracle else None
    result = summarise(outcome.results, plan.settings, phases, plan.synthetic, o.require_lossless,
                       plan.expectations, rule)
    if o.sweep_points:
        result["sweep"] = sweep.summary(result)
    if plan.oracle:
        result["oracle"] = plan.oracle.to_json()
    if plan.launch_plan:
        result["launch_plan"] = plan.launch_plan
    result["identity"] = ident
    if not o.url:  # the GPUs' health at the start and the end of the run, on this host
        result["gpu_health"] = identity.gpu_health_block(ident, o.python)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        used = o.gpu if o.gpu is not None else int(visible) if visible.isdigit() else None
        sick = identity.health_failures(result["gpu_health"], used)
        result["failures"] += sick
        result["ok"] = result["ok"] and not sick
    result["models"] = outcome.models
    if ident and isinstance(ident.get("fingerprint"), dict) and outcome.models:
        ident["fingerprint"]["models"] = [m for m in outcome.models if m.get("repo_id")]  # for `diff`
    result["jit_compiled"] = outcome.jit_compiled
    result["jit_prewarm"] = outcome.jit_prewarm
    return result


def _text(plan: Plan, outcome: Outcome, result: dict) -> str:
    """The tables; the grammar block joins `result` after the main table (its failures are the
    grammar table's, not listed twice)."""
    text = table(result)
    if result.get("sweep"):
        text += "\n\n" + sweep.table(result["sweep"])
    if outcome.models and not plan.synthetic:
        text += "\n" + models_line(outcome.models)
    if plan.grammar:
        order = [*plan.runs, GRAMMAR_RUN]
        servers = sorted(outcome.grammar_servers, key=lambda g: order.index(g.run))  # as the runs
        block = grammar.summary(servers, plan.tokenizer)
        block["target"] = _grammar_target(plan)
        grammar.merge(result, block)
        text += "\n\n" + grammar.table(result["grammar"])
    return text


def _grammar_target(plan: Plan) -> str:
    """Which model the grammar phase ran on (it needs a tokenizer; the oracle pair has none)."""
    if plan.pair in ("oracle", "broken"):
        return ("its own server: the random-weight synthetic target with the 3000-token tokenizer "
                "(the oracle pair has no tokenizer), plain decoding")
    if plan.pair == "random":
        return "every server: the random-weight synthetic pair with the 3000-token tokenizer"
    return "every server: the model's own tokenizer"


def _rule(plan: Plan, o: SmokeOptions) -> dict[int, list[int]]:
    """Request index -> the ids the oracle's rule gives: prompt i for the smoke's own phases, prompt
    i mod N for the sweep's (sweep.prompt_order), so every request of every phase is held to it."""
    ids = [oracle.greedy(plan.oracle.shape, p, o.max_new_tokens) for p in plan.prompts]
    most = max([len(ids)] + [sweep.request_count(c, len(ids), o.sweep_rounds) for c in o.sweep_points])
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


# --- --url: a service that already runs -------------------------------------------------------------

def _api_key(o: SmokeOptions) -> str | None:
    if not o.api_key_file:
        return None
    key = inputs.read_text(o.api_key_file, "key file", "pass the file that holds the service's API key",
                           USAGE, 64 << 10).strip()
    if not key or any(c.isspace() for c in key):
        raise DflashError(f"{o.api_key_file} holds no API key", "it is empty or more than one word",
                          "pass --api-key-file the file the service's apiKeyFile names (one line)", USAGE)
    return key


def _run_url(o: SmokeOptions, phases: dict) -> tuple[Plan, Outcome]:
    """Each service's /server_info first (through a router: a healthy worker's), the plan from the
    first one's (token ids or text), then each measured, the baseline first."""
    key = _api_key(o)
    targets = [(o.url, None)] + ([(o.baseline_url, "baseline")] if o.baseline_url else [])
    found, routers = [], []
    for url, forced in reversed(targets):  # the baseline first, as when smoke starts servers
        ep = loadgen.Endpoint(url.rstrip("/"), key)
        info, router = router_info.server_info(ep)
        if router is not None:
            routers.append({**router, "for": forced or "service"})
            say(f"{url} is a router in front of " + ", ".join(
                f"{w['url']} ({'healthy' if w['healthy'] else 'unhealthy'})" for w in router["workers"]))
        algorithm = None if forced == "baseline" else info.get("speculative_algorithm")
        if algorithm is None and forced is None:
            say(f"note: {url} runs without speculative decoding; measuring plain decoding")
        found.append((forced or algorithm or "baseline", algorithm, ep, info))
    tokenizer = not found[0][3].get("skip_tokenizer_init", False)
    prompts = (loadgen.text_prompts(o.requests) if tokenizer
               else loadgen.token_prompts(o.requests, o.input_len, o.seed))
    runs = [name for name, *_ in found]
    settings = run_settings(o, runs, False, "external", "text" if tokenizer else "token ids")
    if routers:
        settings["routers"] = routers  # the result names each router and its workers
    plan = Plan(tuple(runs), False, "external", tuple(prompts), settings, grammar=o.grammar)
    outcome = Outcome()
    for name, algorithm, ep, _ in found:
        t = time.monotonic()
        outcome.results.append(measure(name, algorithm, ep, plan, o, outcome, watch=lambda: None))
        phases[f"measure {name}"] = time.monotonic() - t
    return plan, outcome


# --- servers started here ---------------------------------------------------------------------------

def _plan_local(o: SmokeOptions, work: Path, phases: dict) -> Plan:
    """The runs, the prompts, the models written, each server's spec and how they start."""
    pair = o.synthetic_pair
    accepted = sglang_features.speculative_algorithms(o.python)
    if not accepted:
        raise DflashError(f"SGLang is not installed for {o.python}",
                          "sglang/srt/server_args.py was not found or has no --speculative-algorithm",
                          "run smoke with the stack's interpreter (nix run .#dflash-smoke), or pass --python",
                          PREFLIGHT_SGLANG)
    runs = select_runs(o.runs, accepted, pair)
    launch = o.launch or ("together" if pair else "sequential")
    shape = oracle_shape(o, pair)
    prompts = local_prompts(o, shape)
    models = write_models(o, runs, prompts, shape, work, phases)
    check_pairs(o, models.specs)  # a real pair: serve's model-pair rules before any server starts
    check_tp(o, models.specs)
    say(f"runs: {', '.join(s.run for s in models.specs)}; launch {launch}; work dir {work}")
    say(driver_note())
    note = first_start_note()
    if note:
        say(note)
    chosen = memory.decide_launch(o, models.specs, launch, pair is not None)
    settings = run_settings(o, runs, pair is not None, chosen.mode, "token ids" if pair else "text")
    settings["pair"] = pair
    return Plan(tuple(runs), pair is not None, chosen.mode, tuple(prompts), settings, grammar=o.grammar,
                pair=pair, specs=tuple(models.specs), fraction=chosen.fraction, launch_plan=chosen.plan,
                tokenizer=models.tokenizer, oracle=models.oracle, expectations=models.expectations)


def _run_local(o: SmokeOptions, phases: dict, t0: float, work: Path) -> tuple[Plan, Outcome]:
    plan = _plan_local(o, work, phases)
    outcome = Outcome()
    started: list[Started] = []
    prewarm = None
    groups = [list(plan.specs)] if plan.launch == "together" else [[sp] for sp in plan.specs]
    try:
        jit_since = time.time()
        for i, group in enumerate(groups):
            t = time.monotonic()
            fleet = Fleet([start_server(o, sp, plan.launch, work, started, plan.fraction) for sp in group],
                          o.start_timeout)
            if i == 0:
                prewarm, outcome.jit_prewarm = _prewarm_for(o, plan.specs[0].target, started[0])
                if prewarm:
                    prewarm.start()  # `prewarm` holds it first: a stop while it starts still ends it
            _measure_fleet(o, plan, outcome, fleet, t, phases)
            if plan.launch == "sequential":
                stop_all(fleet.started)
        outcome.results.sort(key=lambda r: plan.runs.index(r.name))
        outcome.models = models_loaded(o, plan.specs[0].target, plan.specs[-1].draft, plan.synthetic, started, plan)
        if prewarm:
            outcome.jit_prewarm = prewarm.result()
        caches = startup.jit_caches(started[0].server.env if started else os.environ, _triton_cache_of(started))
        outcome.jit_compiled = startup.compiled_since(caches, jit_since)
        phases["start to table"] = time.monotonic() - t0
        return plan, outcome
    finally:
        stop_all(started)  # also a dead leader: its group may hold helpers
        if prewarm:
            prewarm.stop()
        _keep_logs(o, started)


def _measure_fleet(o: SmokeOptions, plan: Plan, outcome: Outcome, fleet: Fleet, t: float, phases: dict) -> None:
    """By default each server is measured as soon as it is ready, while the others still start
    (their CPU-bound compiling barely touches the GPU); --wait-all waits for all."""
    queue = [fleet.next_ready() for _ in fleet.started] if o.wait_all else []
    while (s := queue.pop(0) if queue else fleet.next_ready()) is not None:
        phases[f"ready {s.run}"] = time.monotonic() - t
        busy = [other.run for other in fleet.started if other.startup_s is None]
        t_m = time.monotonic()
        result = measure(s.run, s.cfg.speculative.algorithm, loadgen.Endpoint(s.cfg.base_url), plan, o, outcome,
                         watch=fleet.check, startup_s=s.startup_s, log=_log_kept(o, s),
                         throughput=s.run != GRAMMAR_RUN)
        result.measured_while_starting = busy
        result.startup = _startup_of(s)
        if s.run != GRAMMAR_RUN:
            outcome.results.append(result)
        phases[f"measure {s.run}"] = time.monotonic() - t_m


def models_loaded(o: SmokeOptions, target: str, draft: str | None, synthetic_pair: bool, started: list,
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
    for role, model, rev in (("target", target, o.model_revision), ("drafter", draft, o.draft_model_revision)):
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


def _prewarm_for(o: SmokeOptions, target: str, first: Started) -> tuple["jit_prewarm.Prewarm | None", dict | None]:
    """The JIT helper (not yet started), in the servers' environment, with the target's shapes; or,
    where it is not to be started, why (the result's jit_prewarm): off, no config.json on this disk (a hub id: no shapes
    to compile for), or nothing to compile (the prebuilt kernels hold every module, and its
    import of torch and SGLang would only slow the servers' own)."""
    if not o.jit_prewarm:
        return None, {"enabled": False, "reason": "--no-jit-prewarm"}
    try:
        cfg = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        say("JIT prewarm skipped: no readable config.json in the target directory")
        return None, {"enabled": False, "reason": "no local config.json"}
    env = first.server.env
    root = env.get(kernels.PREBUILT_ENV)
    cc = (memory.smoke_gpu(o.python, o.gpu, env) or {}).get("compute_capability") if root else None
    if cc:
        covered, text = kernels.coverage(root, cc, {"target": cfg})
        if covered:
            say(f"JIT prewarm not needed: {root} holds them ({text})")
            return None, {"enabled": False, "covered": True, "reason": f"prebuilt kernels: {text}"}
    say("JIT prewarm: compiling SGLang's JIT kernels in parallel while the servers import")
    return jit_prewarm.Prewarm(o.python, env, jit_prewarm.calls_for(cfg)), None


def _startup_of(s: Started) -> dict | None:
    """Where this server's start-up went, from its own log (startup.py)."""
    try:
        text = s.server.log_path.read_text(errors="replace")
    except OSError:
        return None
    return startup.phases(text, s.launched, s.startup_s)


def _triton_cache_of(started: list[Started]) -> str | None:
    return started[0].cfg.environment.get("TRITON_CACHE_DIR") if started else None


def _log_kept(o: SmokeOptions, s: Started) -> str | None:
    if o.keep_logs:
        return str(Path(o.keep_logs).resolve() / f"{s.run}.log")
    return str(s.server.log_path) if o.work_dir else None


def _keep_logs(o: SmokeOptions, started: list[Started]) -> None:
    """Copy each server's full log to --keep-logs DIR (a failed start is when it matters most)."""
    if not o.keep_logs or not started:
        return
    dest = Path(o.keep_logs)
    dest.mkdir(parents=True, exist_ok=True)
    for s in started:
        try:
            shutil.copyfile(s.server.log_path, dest / f"{s.run}.log")
        except OSError as e:
            say(f"could not keep the {s.run} log: {e}")
    say(f"server logs kept in {dest}")
