"""Start the smoke test's SGLang servers the way `dflashctl serve` does, and watch them.

Each run becomes an instance JSON (the same keys the NixOS module writes), then
config.from_dict -> sglang_args.build_argv/build_env -> server.Server: smoke exercises the
service's own code path. Several servers may share one GPU (`launch together`), so waiting and
watching cover all of them: the first that dies ends everything within a second.
"""

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dflashctl import config, sglang_args, synthetic
from dflashctl.errors import SERVER_DIED_AFTER_READY, DflashError
from dflashctl.server import Server

SPECULATIVE = ("DFLASH", "DDTREE")


def say(msg: str) -> None:
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    if extra:
        d["extraArgs"] = extra
    if a.gpu is not None:
        d["gpus"] = [a.gpu]
    cache = _triton_cache(a)
    if cache:
        d["environment"] = {"TRITON_CACHE_DIR": cache}
    if synthetic_pair:
        d.update({"loadFormat": "dummy", "skipTokenizerInit": True, "grammarBackend": "none",
                  "samplingBackend": "pytorch"})
    if run in SPECULATIVE:
        d["draftModel"] = draft
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


def start_server(a, run: str, target: str, draft: str | None, synthetic_pair: bool, launch: str,
                 work: Path, started: list[Started]) -> Started:
    """Start one run's server (not waiting for it); `a` holds smoke's command-line options.

    It joins `started` before its process exists, so a SIGTERM at any moment still stops it."""
    d = instance_settings(a, run, target, draft, synthetic_pair, _free_port(), launch)
    cfg = config.from_dict(d, d["name"], origin="smoke settings")
    srv = Server(sglang_args.build_argv(cfg, python=a.python), sglang_args.build_env(cfg),
                 work / "logs" / f"{run}.log", cfg.base_url)
    s = Started(run, srv, cfg)
    started.append(s)
    srv.start()
    say(f"started {run} on {cfg.base_url} (pid {srv.pid}, log {srv.log_path})")
    return s


def _renamed(run: str, e: DflashError) -> DflashError:
    return DflashError(f"{run} server: {e.what}", e.why, e.fix, e.exit_code)


def wait_all(started: list[Started], timeout: float) -> None:
    """Wait until every server is ready; the first that dies or times out ends the wait at once."""
    status = {s.run: (0.0, "") for s in started}
    errors: list[DflashError] = []
    threads = []

    def waiter(s: Started) -> None:
        try:
            s.startup_s = s.server.wait_ready(timeout, on_progress=lambda t, line: status.__setitem__(s.run, (t, line)))
        except DflashError as e:
            errors.append(_renamed(s.run, e))

    for s in started:
        t = threading.Thread(target=waiter, args=(s,), daemon=True, name=f"wait-{s.run}")
        t.start()
        threads.append(t)
    last = time.monotonic()
    while any(t.is_alive() for t in threads) and not errors:
        time.sleep(0.1)
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            for s in started:
                if s.startup_s is None:
                    t, line = status[s.run]
                    say(f"starting {s.run}: {t:.0f}s, log: {line[:150]}")
    if errors:
        raise errors[0]


def watch_all(started: list[Started]):
    """A check that raises when any of our servers has exited (used while requests run)."""
    def watch() -> None:
        for s in started:
            rc = s.server.poll()
            if rc is not None:
                raise DflashError(f"the {s.run} server exited with status {rc} while smoke requests ran",
                                  "its log ends with:\n" + "\n".join("    | " + line for line in
                                                                     s.server.log_tail().splitlines()),
                                  f"read the full log: {s.server.log_path}", SERVER_DIED_AFTER_READY)
    return watch


def stop_all(started: list[Started]) -> None:
    threads = [threading.Thread(target=s.server.stop, kwargs={"grace": 15}) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
