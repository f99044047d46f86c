"""`dflashctl serve --config FILE`: run one SGLang instance under systemd, ready only when it decodes.

Order: settings (exit CONFIG) -> preflight probes in child processes, before any weights load (exit
with the failing probe's code) -> SGLang in its own process group -> /health_generate answers ->
READY=1. A child that dies, before or after ready, is reported at once with the tail of its log.
SIGTERM/SIGINT go to the whole process group; STOPPING=1 tells systemd we are on our way out.
"""

import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from dflashctl.errors import (CONFIG, OK, PREFLIGHT_SGLANG, SERVER_DIED_AFTER_READY, DflashError)
from dflashctl.host import cuda_home
from dflashctl.service import config, sdnotify, sglang_args
from dflashctl.service.server import Server, _describe, _indent
from dflashctl.service.validate import warnings_for

CREDENTIAL = "api-key"  # LoadCredential=api-key:<apiKeyFile> in the unit
LAUNCHER_ENV = "DFLASHCTL_SGLANG_LAUNCHER"  # for tests: replaces `python -m sglang.launch_server`
STOP_GRACE_S = 30.0  # below the unit's TimeoutStopSec, so our SIGKILL comes before systemd's


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stop(signum)


def say(text: str) -> None:
    print(f"dflashctl serve: {text}", file=sys.stderr, flush=True)
    sdnotify.status(text)


def read_api_key(cfg: config.InstanceConfig, env: dict[str, str]) -> str | None:
    if cfg.api_key_file is None:
        return None
    cred_dir = env.get("CREDENTIALS_DIRECTORY")
    path = Path(cred_dir, CREDENTIAL) if cred_dir and Path(cred_dir, CREDENTIAL).exists() \
        else Path(cfg.api_key_file)
    try:
        key = path.read_text().strip()
    except OSError as e:
        raise DflashError(f"cannot read the API key {path}", e.strerror or str(e),
                          "create apiKeyFile (readable by root; systemd hands it to the service)",
                          CONFIG)
    if not key or any(c.isspace() for c in key):
        raise DflashError(f"the API key in {path} is empty or contains whitespace", "",
                          "write the key as one line of printable characters", CONFIG)
    return key


def preflight(cfg: config.InstanceConfig, python: str, child_env: dict[str, str]) -> None:
    try:
        from dflashctl.host import probes
    except ImportError as e:
        raise DflashError("dflashctl's preflight probes are missing", str(e),
                          "reinstall dflashctl; `--skip-preflight` starts without them", PREFLIGHT_SGLANG)
    for w in jit_toolchain_warnings(child_env):
        say(f"preflight warning: {w}")
    say("preflight: checking torch, sgl_kernel, grammar backend, soundfile, native libraries, driver")
    checks = probes.preflight(cfg.grammar_backend, cfg.speculative.algorithm, python=python)
    for c in checks:
        if c.status == "warn":
            say(f"preflight warning: {c.name}: {c.summary}")
    failed = probes.first_failure(checks)
    if failed is not None:
        facts = "\n".join(f"{k}: {v}" for k, v in (failed.details or {}).items())
        why = failed.summary + (f"\n{_indent(facts)}" if facts else "")
        raise DflashError(f"preflight {failed.name} failed; SGLang was not started", why,
                          failed.fix, failed.exit_code)
    say(f"preflight: {len(checks)} checks passed")


def jit_toolchain_warnings(env: dict[str, str]) -> list[str]:
    """What SGLang's first start compiles with, looked up as tvm-ffi and flashinfer do, in the child's env.

    Their JIT kernels are built with nvcc (CUDA_HOME/CUDA_PATH, else nvcc on PATH, else
    /usr/local/cuda; cuda_home.provide points CUDA_HOME at the stack's own nvcc wheels) and the host
    compiler `c++` (or CXX). SGLang 0.5.11 sets the GPU architecture itself (TVM_FFI_CUDA_ARCH_LIST
    from torch), so nvidia-smi is not needed. A missing tool only shows after the weights have
    loaded, so say it now. A warning, not a failure: a host may set these up in ways this cannot see.
    """
    path = env.get("PATH", os.defpath)
    missing = []
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home:
        if not os.access(Path(cuda_home, "bin", "nvcc"), os.X_OK):
            missing.append(f"nvcc (CUDA_HOME={cuda_home} has no bin/nvcc)")
    elif not shutil.which("nvcc", path=path) and not os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        missing.append("nvcc (not on PATH, no CUDA_HOME, no /usr/local/cuda)")
    cxx = env.get("CXX", "c++")
    if not shutil.which(cxx, path=path):
        missing.append(f"the C++ compiler {cxx!r}")
    if not missing:
        return []
    return [f"SGLang compiles its JIT kernels at the first start (nvcc, c++; about a minute), but "
            f"{'; '.join(missing)} cannot be found with PATH={path}: the start will fail after the "
            "weights load. Install the locked stack (its nvidia-cuda-nvcc wheel provides nvcc) and "
            "gcc/g++ on the host, or set CUDA_HOME, CXX or PATH in the instance's environment"]


def launch_argv(cfg: config.InstanceConfig, python: str, api_key: str | None,
                launcher: str | None) -> list[str]:
    argv = sglang_args.build_argv(cfg, python, api_key)
    if launcher:
        argv = shlex.split(launcher) + argv[3:]  # keep the mapped flags, swap the program
    return argv


def default_log_path(cfg: config.InstanceConfig, env: dict[str, str]) -> Path:
    logs = env.get("LOGS_DIRECTORY", "").split(":")[0]
    return Path(logs or tempfile.gettempdir(), f"dflash-{cfg.name}-sglang.log")


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run one SGLang instance, ready only when it decodes",
                              description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, metavar="FILE", help="the instance's settings JSON")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="interpreter with the stack (default: the one running dflashctl)")
    p.add_argument("--skip-preflight", action="store_true",
                   help="start SGLang without the preflight probes (diagnosis only)")
    p.add_argument("--log-file", metavar="PATH",
                   help="SGLang's log (default: $LOGS_DIRECTORY or the temp dir); also echoed to stderr")
    p.add_argument("--launcher", metavar="CMD", default=os.environ.get(LAUNCHER_ENV),
                   help=f"for tests: run CMD instead of `python -m sglang.launch_server`, with the "
                        f"same flags (env {LAUNCHER_ENV})")
    p.add_argument("--dry-run", action="store_true",
                   help="print the SGLang command and environment as JSON, start nothing")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        return _run(args)
    except DflashError as e:
        # Without this, `systemctl status` would keep showing the last progress line
        # ("preflight: checking ...") next to the failed unit.
        sdnotify.status(failure_status(e), limit=STATUS_FAILURE_LIMIT)
        raise


STATUS_FAILURE_LIMIT = 400  # what failed plus its fix; longer than a progress line


def failure_status(e: DflashError) -> str:
    """One line for systemd's StatusText: the exit code, what failed, and the fix."""
    text = f"failed (exit {e.exit_code}): {e.what}"
    return text + (f"; fix: {e.fix}" if e.fix else "")


def _run(args) -> int:
    env = dict(os.environ)
    cfg = config.load(args.config)
    for w in warnings_for(cfg):
        say(f"warning: {w}")
    if args.dry_run:
        argv = launch_argv(cfg, args.python, None, args.launcher)
        child_env = sglang_args.build_env(cfg, {})
        print(json.dumps({"argv": argv, "env": child_env}, indent=2))
        return OK
    api_key = read_api_key(cfg, env)
    child_env = cuda_home.provide(sglang_args.build_env(cfg, env), args.python)
    if not args.skip_preflight:
        preflight(cfg, args.python, child_env)
    server = Server(launch_argv(cfg, args.python, api_key, args.launcher),
                    child_env, Path(args.log_file or default_log_path(cfg, env)),
                    cfg.base_url, api_key, echo=sys.stderr)
    _rotate(server.log_path)
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _supervise(cfg, server)
    except _Stop as stop:
        sdnotify.notify("STOPPING=1")
        say(f"got {signal.Signals(stop.signum).name}; stopping SGLang (process group {server.pid})")
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        rc = server.stop(STOP_GRACE_S)
        say(f"SGLang stopped with status {_describe(rc) if rc is not None else 'not started'}")
        return OK
    except DflashError as e:
        sdnotify.status(f"failed: {e.what}")
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if server.proc is not None:
            server.stop(STOP_GRACE_S)  # no orphans, whatever ended the supervision


def _supervise(cfg: config.InstanceConfig, server: Server) -> int:
    say(f"starting SGLang for {cfg.model} on {cfg.base_url} (log: {server.log_path})")
    server.start()
    took = server.wait_ready(
        cfg.start_timeout_sec,
        on_progress=lambda t, line: sdnotify.status(f"loading ({t:.0f} s): {line}"))
    sdnotify.notify("READY=1")
    say(f"ready after {took:.1f} s: {cfg.base_url}/health_generate decoded a token")
    while True:
        rc = server.wait(0.2)
        if rc is not None:
            raise DflashError(f"SGLang exited with status {_describe(rc)} while serving",
                              "its log ends with:\n" + _indent(server.log_tail()),
                              f"read the log above (full log: {server.log_path}); systemd restarts "
                              "the service with backoff", SERVER_DIED_AFTER_READY)


def _rotate(log: Path) -> None:
    """Keep the previous start's log as <log>.1: the log tail must be this start's."""
    if log.exists():
        log.replace(log.with_name(log.name + ".1"))
