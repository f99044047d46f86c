"""Start the smoke test's SGLang servers the way `dflashctl serve` does, and watch them.

Each run becomes an instance JSON (the same keys the NixOS module writes), then
config.from_dict -> sglang_args.build_argv/build_env -> server.Server: smoke exercises the
service's own code path. Several servers may share one GPU (`launch together`), so waiting and
watching cover all of them: the first that dies ends everything within a second.
"""

import datetime
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import SERVER_DIED_AFTER_READY, DflashError
from dflashctl.host import cuda_home, driver, jit_caches, kernels
from dflashctl.service import config, sglang_args
from dflashctl.service.config import MAX_PORT
from dflashctl.service.server import Server
from dflashctl.smoke import synthetic

SPECULATIVE = ("DFLASH", "DDTREE")
DEFAULT_SYNTHETIC_KV_TOKENS = 65536  # 1 GiB for the synthetic target; smoke needs ~2.5k tokens


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


def instance_settings(a, run: str, target: str, draft: str | None, synthetic_pair: bool, port: int,
                      launch: str) -> dict:
    """The instance JSON for one run, as `dflashctl serve --config` would read it."""
    d: dict = {"name": f"smoke-{run.lower()}", "model": target, "host": "127.0.0.1", "port": port,
               "allowSharedGpus": True, "startTimeoutSec": int(a.start_timeout)}
    mem = a.mem_fraction_static
    if mem is None and synthetic_pair:
        mem = 0.25 if launch == "together" else 0.5
    if mem is not None:
        d["memFractionStatic"] = mem
    attention = a.attention_backend or ("triton" if synthetic_pair else None)
    if attention:
        d["attentionBackend"] = attention
    max_bs = a.cuda_graph_max_bs or (8 if synthetic_pair and not a.cuda_graph_bs else None)
    if max_bs:
        d["cudaGraphMaxBs"] = max_bs
    if a.no_cuda_graph:
        d["disableCudaGraph"] = True
    extra = []
    if a.cuda_graph_bs:
        extra += ["--cuda-graph-bs", *[b.strip() for b in a.cuda_graph_bs.split(",") if b.strip()]]
    if synthetic_pair and not a.piecewise_cuda_graph:
        extra.append("--disable-piecewise-cuda-graph")
    # SGLang sizes the KV cache as free-after-load minus (1 - fraction) x free-before-load: if a
    # neighbour allocates in between, that goes negative ("Not enough memory"). A cap keeps every
    # server's allocation small, so side-by-side starts cannot race.
    tokens = DEFAULT_SYNTHETIC_KV_TOKENS if a.max_total_tokens is None and synthetic_pair else a.max_total_tokens
    if tokens:
        extra += ["--max-total-tokens", str(tokens)]
    if extra:
        d["extraArgs"] = extra
    if a.gpu is not None:
        d["gpus"] = [a.gpu]
    # Milliseconds in SGLang's log stamps: the start-up phases (startup.py) are read from them.
    d["environment"] = {"SGLANG_LOG_MS": "1"}
    cache = _triton_cache(a)
    if cache:
        d["environment"]["TRITON_CACHE_DIR"] = cache
    grammar_phase = not getattr(a, "no_grammar", False)
    if synthetic_pair:
        d.update({"loadFormat": "dummy", "samplingBackend": "pytorch"})
        if not grammar_phase:  # no tokenizer was written: token ids in and out, no grammar backend
            d.update({"skipTokenizerInit": True, "grammarBackend": "none"})
    if grammar_phase:  # a random model pads JSON with whitespace until max_new_tokens without it
        d["constrainedJsonDisableAnyWhitespace"] = True
    if not synthetic_pair and getattr(a, "model_revision", None):
        d["modelRevision"] = a.model_revision
    if run in SPECULATIVE:
        d["draftModel"] = draft
        if not synthetic_pair and getattr(a, "draft_model_revision", None):
            d["draftModelRevision"] = a.draft_model_revision
        s: dict = {"algorithm": run}
        n = a.num_draft_tokens or (synthetic.PairShape().block_size if synthetic_pair else None)
        if n:
            s["numDraftTokens"] = n
        if run == "DDTREE" and a.ddtree_budget:
            s["ddtreeBudget"] = a.ddtree_budget
        if attention:
            s["draftAttentionBackend"] = attention
        d["speculative"] = s
        if synthetic_pair:
            d["draftLoadFormat"] = "dummy"
    return d


@dataclass
class Started:
    run: str
    server: Server
    cfg: config.InstanceConfig
    startup_s: float | None = None
    launched: datetime.datetime | None = None  # local time, as SGLang stamps its log


def start_server(a, run: str, target: str, draft: str | None, synthetic_pair: bool, launch: str,
                 work: Path, started: list[Started]) -> Started:
    """Start one run's server (not waiting for it); `a` holds smoke's command-line options.

    It joins `started` before its process exists, so a SIGTERM at any moment still stops it."""
    d = instance_settings(a, run, target, draft, synthetic_pair, _free_port(), launch)
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
