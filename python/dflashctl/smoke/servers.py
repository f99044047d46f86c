"""Start the smoke test's SGLang servers the way `dflashctl serve` does, and watch them.

Each run becomes an instance JSON (the same keys the NixOS module writes), then
config.from_dict -> sglang_args.build_argv/build_env -> server.Server: smoke exercises the
service's own code path. Several servers may share one GPU (`launch together`), so waiting and
watching cover all of them: the first that dies ends everything within a second.
"""

import datetime
import json
import math
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import SERVER_DIED_AFTER_READY, DflashError
from dflashctl.host import cuda_home, driver, gpus, jit_caches, kernels
from dflashctl.service import config, model_check, sglang_args
from dflashctl.service.config import MAX_PORT
from dflashctl.service.server import Server
from dflashctl.smoke import sweep, synthetic

SPECULATIVE = ("DFLASH", "DDTREE")
DEFAULT_SYNTHETIC_KV_TOKENS = 65536  # 1 GiB for the random target; smoke needs ~2.5k tokens


def say(msg: str) -> None:
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    """A free loopback port SGLang accepts: at most config.MAX_PORT (it derives port + 10000)."""
    for _ in range(200):
        port = random.randint(20000, MAX_PORT)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise DflashError(f"no free loopback port between 20000 and {MAX_PORT}", "200 tries were all taken",
                      "stop some local servers, or pass --url to test a running one")


def jit_cache_dir(env=os.environ) -> Path:
    """Where the servers' SGLang JIT kernels (sgl_kernel_jit through tvm-ffi) are compiled to: the
    variable build_env gives them (host/jit_caches.py), else tvm-ffi's own rule."""
    env = dict(env)
    return jit_caches.caches(jit_caches.provide(env, jit_caches.root_for(env)))["tvm-ffi"]


def first_start_note(env=os.environ) -> str | None:
    """A line for the user when SGLang has never compiled its JIT kernels here (about 50 s of nvcc
    on an H200, docs/benchmarks.md); None once the cache holds something."""
    cache = jit_cache_dir(env)
    if env.get(kernels.PREBUILT_ENV):
        return (f"SGLang's JIT kernels: prebuilt ones from {env[kernels.PREBUILT_ENV]}; what they lack "
                f"compiles into {cache}")
    try:
        if any(cache.iterdir()):
            return None
    except OSError:
        pass  # no cache directory yet
    return (f"first start on this host: SGLang compiles its JIT kernels with nvcc (about a minute); "
            f"they are kept in {cache} and beside it, so later starts skip it")


def driver_note() -> str:
    """What driver discovery found, before any server starts (a mismatch stops smoke here)."""
    _, found = driver.provide(dict(os.environ))
    return (f"driver: {found.describe()}" if found else
            "driver: no NVIDIA driver libraries found by discovery; the loader's own search decides")


def _triton_cache(a) -> str | None:
    if a.triton_cache == "none":
        return None
    if a.triton_cache:
        return str(Path(a.triton_cache).resolve())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dflashctl", "triton")


@dataclass(frozen=True)
class RunSpec:
    """One server smoke starts: which run, which weights, how they load."""
    run: str  # "baseline", "DFLASH", "DFLASH-poisoned", "DDTREE", "grammar"
    algorithm: str | None  # --speculative-algorithm, None for plain decoding
    target: str
    draft: str | None = None
    dummy: bool = False  # SGLang gives random weights from config.json (--load-format dummy)
    tokenizer: bool = True  # False: --skip-tokenizer-init, token ids in and out, no grammar backend
    synthetic: bool = True  # a pair written here (smoke's defaults apply) or --model's
    kv_tokens: int | None = None  # --max-total-tokens for this server (None: the smoke-wide choice)
    cuda_graphs: bool = True  # False for a server that is not timed (the grammar server): ready sooner


def instance_settings(a, spec: RunSpec, port: int, launch: str, fraction: float | None = None) -> dict:
    """The instance JSON for one run, as `dflashctl serve --config` would read it; `fraction`:
    the memory fraction the launch plan chose (memory_plan), else the flag's or the default."""
    synthetic_pair = spec.synthetic
    d: dict = {"name": f"smoke-{spec.run.lower()}", "model": spec.target, "host": "127.0.0.1", "port": port,
               "allowSharedGpus": True, "startTimeoutSec": int(a.start_timeout)}
    mem = a.mem_fraction_static if a.mem_fraction_static is not None else fraction
    if mem is None and synthetic_pair:
        mem = 0.25 if launch == "together" else 0.5
    if mem is not None:
        d["memFractionStatic"] = mem
    attention = a.attention_backend or ("triton" if synthetic_pair else None)
    if attention:
        d["attentionBackend"] = attention
    points = getattr(a, "sweep_points", None) if spec.cuda_graphs else None  # a server without graphs is not timed
    own_graphs = bool(a.cuda_graph_bs or a.cuda_graph_max_bs)
    max_bs = a.cuda_graph_max_bs or (8 if synthetic_pair and not a.cuda_graph_bs and not points else None)
    if max_bs:
        d["cudaGraphMaxBs"] = max_bs
    if a.no_cuda_graph or not spec.cuda_graphs:
        d["disableCudaGraph"] = True
    extra = []
    if a.cuda_graph_bs:
        extra += ["--cuda-graph-bs", *[b.strip() for b in a.cuda_graph_bs.split(",") if b.strip()]]
    if points:  # the concurrency sweep (sweep.py): every point at once, in its own CUDA graph
        extra += sweep.server_args(points, a.requests, graphs=not (a.no_cuda_graph or own_graphs))
    if synthetic_pair and not a.piecewise_cuda_graph:
        extra.append("--disable-piecewise-cuda-graph")
    tokens = kv_tokens(a, spec)
    if tokens:
        extra += ["--max-total-tokens", str(tokens)]
    if extra:
        d["extraArgs"] = extra
    tp = getattr(a, "tp_size", 1) or 1
    if tp > 1:  # tensor parallelism: --gpu (default 0) and the next ones, as the module's gpus list
        first = a.gpu or 0
        d.update(gpus=list(range(first, first + tp)), tpSize=tp)
    elif a.gpu is not None:
        d["gpus"] = [a.gpu]
    # Milliseconds in SGLang's log stamps: the start-up phases (startup.py) are read from them.
    d["environment"] = {"SGLANG_LOG_MS": "1"}
    cache = _triton_cache(a)
    if cache:
        d["environment"]["TRITON_CACHE_DIR"] = cache
    if synthetic_pair:
        d["samplingBackend"] = "pytorch"
        if spec.dummy:
            d["loadFormat"] = "dummy"
        if not spec.tokenizer:  # token ids in and out, no grammar backend
            d.update({"skipTokenizerInit": True, "grammarBackend": "none"})
    if spec.tokenizer and not getattr(a, "no_grammar", False):
        d["constrainedJsonDisableAnyWhitespace"] = True  # a random model pads JSON with whitespace without it
    if not synthetic_pair and getattr(a, "model_revision", None):
        d["modelRevision"] = a.model_revision
    if spec.algorithm:
        d["draftModel"] = spec.draft
        if not synthetic_pair and getattr(a, "draft_model_revision", None):
            d["draftModelRevision"] = a.draft_model_revision
        s: dict = {"algorithm": spec.algorithm}
        n = a.num_draft_tokens or (synthetic.PairShape().block_size if synthetic_pair else None)
        if n:
            s["numDraftTokens"] = n
        if spec.algorithm == "DDTREE" and a.ddtree_budget:
            s["ddtreeBudget"] = a.ddtree_budget
        if attention:
            s["draftAttentionBackend"] = attention
        d["speculative"] = s
        if synthetic_pair and spec.dummy:
            d["draftLoadFormat"] = "dummy"
    return d


def check_pairs(a, specs: list[RunSpec]) -> None:
    """A real pair (--model with --draft-model) held to serve's model-pair rules before any server
    starts; its warnings said, its failures raised (exit 79) with each fix."""
    failed, seen = [], set()
    for spec in specs:
        if spec.synthetic or not spec.algorithm or (spec.algorithm, spec.target, spec.draft) in seen:
            continue
        seen.add((spec.algorithm, spec.target, spec.draft))
        cfg = config.from_dict(instance_settings(a, spec, 30000, "sequential"), origin="smoke settings")
        for c in model_check.check(cfg, sglang_args.build_env(cfg), "<smoke's settings>").checks:
            if c.status == "warn":
                say(f"warning: {spec.run}: {c.name}: {c.summary}; fix: {c.fix}")
            elif c.status == "fail":
                failed.append(c)
    if failed:
        listed = "".join(f"\n  - {c.name}: {c.summary}; fix: {c.fix}" for c in failed)
        raise DflashError(f"the model pair does not fit ({len(failed)} problem(s)); no server was started",
                          listed.lstrip("\n"), "apply each fix above (docs/service.md, 'The model pair')",
                          failed[0].exit_code)


def kv_tokens(a, spec: RunSpec) -> int | None:
    """KV-cache tokens of one server: --max-total-tokens, else the synthetic cap (0: SGLang's)."""
    if a.max_total_tokens is not None:
        return a.max_total_tokens or None
    if not spec.synthetic:
        return None
    return spec.kv_tokens or DEFAULT_SYNTHETIC_KV_TOKENS


# --- memory: servers sharing a GPU ------------------------------------------------------------------
#
# SGLang 0.5.11 sizes a server's KV pool as
#     rest = free memory after its weights loaded - (1 - memFractionStatic) x free memory at its init
# and stops with "Not enough memory" when rest <= 0. Servers started side by side each take their
# init snapshot at a moment smoke does not control. The worst case for server i is that its
# snapshot still sees everything free (F) and every other server has allocated all it will ever
# hold (U_j) before i measures again: rest_i = f x F - sum_j U_j - W_i - C. (A snapshot taken after
# some neighbour allocated loses only f x U_j of the budget instead of U_j: never worse.)
# So a start together is race-free when, for every i, f x F >= KV_i + W_i + C + sum_{j != i} U_j,
# and sum_i U_i <= F. With --max-total-tokens capping every pool, U_j is small and known.

SERVER_OVERHEAD_MIB = 4096  # CUDA context, graphs, activations; H200 logs: 2.3-3.2 GiB besides weights and KV


def kv_bytes_per_token(cfg: dict) -> int:
    """K and V of every layer in bf16: SGLang's cell size for an MHA model."""
    return cfg["num_key_value_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"] * 2 * 2


def server_demand_mib(spec: RunSpec, tokens: int) -> dict:
    """What one synthetic server holds at most: weights (file sizes; a dummy load: the target's
    parameter count), KV pool(s) at `tokens`, and the fixed overhead."""
    mib = 1 << 20
    weights = kv = 0
    for path in (spec.target, spec.draft if spec.algorithm else None):
        if path is None:
            continue
        cfg = json.loads((Path(path) / "config.json").read_text())
        st = Path(path) / "model.safetensors"
        if st.exists():
            weights += st.stat().st_size
        else:  # dummy weights: embeddings, lm_head and the layers' projections, bf16
            d, layers, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
            kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
            per_layer = d * (cfg["num_attention_heads"] * cfg["head_dim"]) * 2 + d * kvd * 2 + \
                3 * d * cfg["intermediate_size"]
            weights += 2 * (2 * v * d + layers * per_layer)
        kv += kv_bytes_per_token(cfg) * tokens
    static = (weights + kv) // mib + 1
    return {"run": spec.run, "weights_mib": weights // mib + 1, "kv_mib": kv // mib + 1, "static_mib": static,
            "total_mib": static + SERVER_OVERHEAD_MIB}


def memory_plan(free_mib: int | None, demands: list[dict], fraction: float) -> dict:
    """Whether servers with these demands may start side by side at memFractionStatic `fraction`
    without depending on the order in which they measure the GPU (the rule above). Returns the
    plan: `together` True with the fraction to use (the given one, or the least that fits), or
    False with the reason (then smoke starts them one at a time)."""
    plan = {"rule": "f x free >= static_i + overhead_i + sum of the others' totals, for every server",
            "free_mib": free_mib, "demands": demands, "fraction": fraction}
    if free_mib is None:
        return {**plan, "together": False, "reason": "the GPU's free memory could not be read (NVML)"}
    if len(demands) <= 1:
        return {**plan, "together": True, "needed_fraction": None}
    total = sum(d["total_mib"] for d in demands)
    needed = max((d["static_mib"] + SERVER_OVERHEAD_MIB + total - d["total_mib"]) / free_mib for d in demands)
    plan["needed_fraction"] = round(needed, 4)
    if total > free_mib:
        return {**plan, "together": False,
                "reason": f"the servers hold up to {total} MiB together, {free_mib} MiB are free"}
    if needed <= fraction:
        return {**plan, "together": True}
    chosen = math.ceil(needed * 100) / 100
    if chosen > 0.85:
        return {**plan, "together": False,
                "reason": f"side by side each would need memFractionStatic {needed:.2f} of {free_mib} MiB free"}
    return {**plan, "together": True, "fraction": chosen}


def smoke_gpu(a, env=os.environ) -> dict | None:
    """NVML's entry (a replayed recording in tests) for the GPU the servers will use: --gpu, else
    the first of CUDA_VISIBLE_DEVICES, else the first listed; None where NVML cannot say."""
    try:
        result = gpus.read(a.python, env=driver.provide(dict(env))[0])
    except DflashError:
        return None
    facts = result.get("facts") or {}
    listed = facts.get("gpus") or []
    if not result.get("ok") or not listed:
        return None
    index = a.gpu
    if index is None:
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        index = int(visible) if visible.isdigit() else listed[0].get("index", 0)
    return next((g for g in listed if g.get("index") == index), None)


def free_gpu_mib(a, env=os.environ) -> int | None:
    """Free memory of the GPU the servers will use."""
    gpu = smoke_gpu(a, env)
    return (gpu.get("memory_mib") or {}).get("free") if gpu else None


@dataclass
class Started:
    run: str
    server: Server
    cfg: config.InstanceConfig
    startup_s: float | None = None
    launched: datetime.datetime | None = None  # local time, as SGLang stamps its log


def start_server(a, spec: RunSpec, launch: str, work: Path, started: list[Started],
                 fraction: float | None = None) -> Started:
    """Start one run's server (not waiting for it); `a` holds smoke's command-line options.

    It joins `started` before its process exists, so a SIGTERM at any moment still stops it."""
    run = spec.run
    d = instance_settings(a, spec, _free_port(), launch, fraction)
    cfg = config.from_dict(d, d["name"], origin="smoke settings")
    env, _ = driver.provide(kernels.provide(cuda_home.provide(sglang_args.build_env(cfg), a.python)))
    srv = Server(sglang_args.build_argv(cfg, python=a.python), env,
                 work / "logs" / f"{run}.log", cfg.base_url)
    s = Started(run, srv, cfg)
    started.append(s)
    s.launched = datetime.datetime.now()
    srv.start()
    say(f"started {run} on {cfg.base_url} (pid {srv.pid}, log {srv.log_path})")
    return s


def _renamed(run: str, e: DflashError) -> DflashError:
    return DflashError(f"{run} server: {e.what}", e.why, e.fix, e.exit_code)


class Fleet:
    """Servers starting side by side: hands them out as each becomes ready, so one can be measured
    while the others still start, and `check()` raises as soon as any of them dies or times out."""

    def __init__(self, started: list[Started], timeout: float):
        self.started = started
        self._status = {s.run: (0.0, "") for s in started}
        self._errors: list[DflashError] = []
        self._ready: list[Started] = []  # in the order they became ready
        self._handed_out = 0
        self._lock = threading.Lock()
        for s in started:
            threading.Thread(target=self._wait, args=(s, timeout), daemon=True, name=f"wait-{s.run}").start()

    def _wait(self, s: Started, timeout: float) -> None:
        try:
            # Log-only stall check: the servers share a GPU, so its memory says nothing of one of them.
            s.startup_s = s.server.wait_ready(
                timeout, on_progress=lambda t, line: self._status.__setitem__(s.run, (t, line)),
                stall_timeout=s.cfg.stall_timeout_sec)
            with self._lock:
                self._ready.append(s)
        except DflashError as e:
            with self._lock:
                self._errors.append(_renamed(s.run, e))

    def check(self) -> None:
        """Raise if a server died: before ready (wait_ready's error) or after (its exit status)."""
        with self._lock:
            if self._errors:
                raise self._errors[0]
            ready = list(self._ready)
        for s in ready:
            rc = s.server.poll()
            if rc is not None:
                raise DflashError(f"the {s.run} server exited with status {rc} while smoke requests ran",
                                  "its log ends with:\n" + "\n".join("    | " + line for line in
                                                                     s.server.log_tail().splitlines()),
                                  f"read the full log: {s.server.log_path}", SERVER_DIED_AFTER_READY)

    def next_ready(self) -> Started | None:
        """The next server that is ready (waiting for it, with progress on stderr); None when all
        have been handed out."""
        if self._handed_out == len(self.started):
            return None
        last = time.monotonic()
        while True:
            self.check()
            with self._lock:
                if len(self._ready) > self._handed_out:
                    s = self._ready[self._handed_out]
                    self._handed_out += 1
                    say(f"{s.run} ready after {s.startup_s:.1f}s")
                    return s
            time.sleep(0.1)
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                for s in self.started:
                    if s.startup_s is None:
                        t, line = self._status[s.run]
                        say(f"starting {s.run}: {t:.0f}s, log: {line[:150]}")


def stop_all(started: list[Started]) -> None:
    threads = [threading.Thread(target=s.server.stop, kwargs={"grace": 15}) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
