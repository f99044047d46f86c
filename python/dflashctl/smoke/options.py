"""`dflashctl smoke`'s options: built once from the command line, checked, then only read.

from_args refuses what the CLI contract calls a usage error (exit 2, tests/data/cli/contract.json)
and checks every output before any server starts; what it returns is frozen, so no step of the
run can change what a later one sees.
"""

import argparse
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from dflashctl import output
from dflashctl.errors import USAGE, DflashError
from dflashctl.smoke import sweep


@dataclass(frozen=True)
class SmokeOptions:
    # what to test
    model: str | None = None
    draft_model: str | None = None
    model_revision: str | None = None
    draft_model_revision: str | None = None
    url: str | None = None
    baseline_url: str | None = None
    api_key_file: str | None = None
    pair: str = "oracle"  # oracle, random or broken; only without --model
    runs: str = "auto"  # as given, but the broken pair's auto is "baseline,DFLASH"
    grammar: bool = True  # not --no-grammar
    # speculative decoding
    num_draft_tokens: int | None = None
    ddtree_budget: int | None = None
    require_lossless: bool = False
    attention_backend: str | None = None
    # load
    requests: int = 8
    sequential_requests: int = 4
    max_new_tokens: int = 256
    input_len: int = 32
    seed: int = 0
    request_timeout: float = 300
    sweep_points: tuple[int, ...] = ()  # --sweep, parsed: sorted, each once
    sweep_rounds: int = 2
    # server start
    launch: str | None = None  # None: together for the synthetic pairs, sequential for --model
    wait_all: bool = False
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: str | None = None
    piecewise_cuda_graph: bool = False
    no_cuda_graph: bool = False
    triton_cache: str | None = None
    jit_prewarm: bool = True
    fast_start: bool | None = None  # None: the setting's default (on at tp 1)
    gpu: int | None = None
    tp_size: int = 1
    python: str = "python3"
    start_timeout: float = 600
    # output
    json: str | None = None
    work_dir: str | None = None
    lock: str | None = None
    record: str | None = None
    keep_logs: str | None = None

    @property
    def synthetic_pair(self) -> str | None:
        """The pair smoke writes here (oracle, random, broken), None for --model (and --url)."""
        return None if self.model else self.pair


DERIVED = {"grammar", "sweep_points", "runs"}  # not read from the namespace under their own name


def from_args(ns: argparse.Namespace) -> SmokeOptions:
    """The options of one run, or DflashError (USAGE, OUTPUT) naming the flag and its fix."""
    _check_args(ns)
    runs = ns.runs
    if ns.pair == "broken" and not ns.model and runs == "auto":
        runs = "baseline,DFLASH"  # the check of the check: the drafter one position off against the baseline
    opts = SmokeOptions(**{f.name: getattr(ns, f.name) for f in fields(SmokeOptions) if f.name not in DERIVED},
                        runs=runs, grammar=not ns.no_grammar,
                        sweep_points=tuple(sweep.parse(ns.sweep)) if ns.sweep else ())
    _check_outputs(opts)
    return opts


def _usage(what: str, fix: str) -> DflashError:
    return DflashError(what, "", fix, USAGE)


def _check_args(a: argparse.Namespace) -> None:
    _check_pairing(a)
    for name in ("requests", "sequential_requests", "max_new_tokens", "input_len"):
        if getattr(a, name) < (0 if name == "sequential_requests" else 1):
            raise _usage(f"--{name.replace('_', '-')} {getattr(a, name)} is too small", "use a positive number")
    for flag, url in (("--url", a.url), ("--baseline-url", a.baseline_url)):
        if url is not None:
            _check_url(flag, url)
    if a.gpu is not None and a.gpu < 0:
        raise _usage(f"--gpu {a.gpu} is not a GPU index", "pass an index from nvidia-smi (0, 1, ...)")


def _check_pairing(a: argparse.Namespace) -> None:
    """Flags that only make sense with another one."""
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


def _check_url(flag: str, url: str) -> None:
    parts = urlsplit(url) if url.isprintable() else None
    try:
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:
        port_ok = False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise _usage(f"{flag} {url!r} is not an http(s) URL", f"pass {flag} like http://127.0.0.1:30000")


def _check_outputs(o: SmokeOptions) -> None:
    """Where results go, before any server starts (output.py): a finished run must not end in an
    error about its result file."""
    if o.json != "-":
        output.check(o.json, "--json")
    for flag, d in (("--work-dir", o.work_dir), ("--keep-logs", o.keep_logs), ("--record", o.record)):
        output.check_dir(d, flag)
