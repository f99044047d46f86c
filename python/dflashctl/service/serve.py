"""`dflashctl serve --config FILE`: run one SGLang instance under systemd, ready only when it decodes.

Order: settings (exit CONFIG) -> the instance's host:port can be listened on (exit PORT_TAKEN,
naming the program that holds it; also when SGLang's own bind fails later, or another program's
answers would have passed for readiness: service/listen_check.py) -> the preflight's checks that
SGLang must not start without (driver, native libraries, the model pair's files, the GPUs' health and
memory; every failure listed with its fix; exit with the first one's code, a faulty GPU's first) ->
SGLang in its own process group, its GPUs watched (host/gpu_watch.py), the preflight's stack checks
beside its start (a failure stops it: service/preflight.py) -> a real decode and those checks
passed -> READY=1; a start that stops making progress
(no log output, no GPU memory change for stallTimeoutSec) is stopped and reported (exit
SERVER_STALLED). A child that dies, before or after ready, is reported at once with its log's tail;
a GPU that fails (a critical XID, lost, new uncorrected ECC errors) stops SGLang and names the GPU
(exit SERVER_GPU_FAILED). SIGTERM/SIGINT go to the whole process group; STOPPING=1 tells systemd we
are on our way out.
"""

import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from dflashctl import cli_help, inputs, output
from dflashctl.errors import (CONFIG, OK, PREFLIGHT_GPU_FAULT, PREFLIGHT_MODEL_MISSING,
                              SERVER_DIED_AFTER_READY, SERVER_DIED_BEFORE_READY, SERVER_GPU_FAILED, USAGE,
                              DflashError)
from dflashctl.host import gpus, hub_cache, interpreter
from dflashctl.host.gpu_watch import GpuFailure, GpuWatch
from dflashctl.service import config, gpu_claim, listen_check, preflight, sdnotify, sglang_args, unit_text
from dflashctl.service.child_env import child_env as sglang_child_env
from dflashctl.service.child_env import settings_env
from dflashctl.service.server import KILL_WAIT_S, Server, _describe, _indent
from dflashctl.service.stall import GpuMemory
from dflashctl.service.validate import warnings_for

# LoadCredential=<name>:<file> in the unit (names from data/service-unit.json).
API_KEY_CREDENTIAL, HF_TOKEN_CREDENTIAL = "api-key", "hf-token"
LAUNCHER_ENV = "DFLASHCTL_SGLANG_LAUNCHER"  # for tests: replaces `python -m sglang.launch_server`
STOP_GRACE_S = 30.0  # below the unit's TimeoutStopSec, so our SIGKILL comes before systemd's
GPU_FAILED_GRACE_S = 5.0  # SIGTERM to SIGKILL once its GPU failed: nothing is left to drain
PREFLIGHT_FAILED_GRACE_S = 5.0  # and once a check beside its start failed: it has served nothing
DEATH_CAUSE_WAIT_S = 1.5  # SGLang died: the GPU watch's next reading (once a second) may name the cause


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stop(signum)


def say(text: str) -> None:
    print(f"dflashctl serve: {text}", file=sys.stderr, flush=True)
    sdnotify.status(text)


def read_credential(name: str, fallback: str, label: str, option: str, env: dict[str, str]) -> str:
    """A secret from systemd's credentials directory, or from its file when run by hand."""
    cred_dir = env.get("CREDENTIALS_DIRECTORY")
    from_systemd = bool(cred_dir) and Path(cred_dir, name).exists()
    path = Path(cred_dir, name) if from_systemd else Path(fallback)
    try:
        secret = inputs.read_text(path, "secret file", f"create {option} {fallback} (readable by root; "
                                  "systemd hands it to the service)", CONFIG, SECRET_LIMIT).strip()
    except DflashError as e:
        raise DflashError(e.what.replace("cannot read ", f"cannot read {label} ", 1), e.why, e.fix, CONFIG) from None
    if from_systemd and secret == unit_text.unit_data()["credentialFallback"]:
        # The unit's SetCredential= fallback: systemd could not read the file (unit.credentials).
        raise DflashError(f"systemd could not read {option} {fallback} for {label}",
                          "it is missing, or unreadable by root, on this host (LoadCredential= fell back "
                          "to the unit's SetCredential=)",
                          f"create {fallback} (one line, the secret; owned by root, mode 0600), then "
                          "`systemctl restart` the unit", CONFIG)
    if not secret or any(c.isspace() for c in secret):
        raise DflashError(f"{label} in {path} is empty or contains whitespace", "",
                          "write the secret as one line of printable characters", CONFIG)
    return secret


SECRET_LIMIT = 64 << 10  # an API key or a hub token is a line


def read_api_key(cfg: config.InstanceConfig, env: dict[str, str]) -> str | None:
    if cfg.api_key_file is None:
        return None
    return read_credential(API_KEY_CREDENTIAL, cfg.api_key_file, "the API key", "apiKeyFile", env)


def read_hf_token(cfg: config.InstanceConfig, env: dict[str, str]) -> str | None:
    if cfg.hf_token_file is None:
        return None
    return read_credential(HF_TOKEN_CREDENTIAL, cfg.hf_token_file, "the hub token", "hfTokenFile", env)


def check_models_cached(cfg: config.InstanceConfig, child_env: dict[str, str], config_path: str) -> None:
    """offline: the pinned revisions must be whole in the cache SGLang will read, or no start."""
    if not cfg.offline:
        return
    gaps = []
    for model, rev in ((cfg.model, cfg.model_revision), (cfg.draft_model, cfg.draft_model_revision)):
        if model is None or hub_cache.is_local(model):
            continue
        found = hub_cache.inspect(child_env, model, rev)
        if not found.complete:
            shown = ", ".join(found.missing[:8]) + (f" and {len(found.missing) - 8} more"
                                                     if len(found.missing) > 8 else "")
            gaps.append(f"{model}@{rev or 'main'}: missing {shown}")
    if gaps:
        raise DflashError("offline is set, but the models are not fully in the cache "
                          f"({hub_cache.hub_dir(child_env)})", "\n".join(gaps),
                          f"dflashctl models fetch --config {config_path}", PREFLIGHT_MODEL_MISSING)
    say("preflight: models are in the cache (offline)")


def launch_argv(cfg: config.InstanceConfig, python: str, api_key: str | None,
                launcher: str | None) -> list[str]:
    argv = sglang_args.build_argv(cfg, python, api_key)
    if launcher:
        argv = launcher_words(launcher) + argv[3:]  # keep the mapped flags, swap the program
    return argv


def launcher_words(launcher: str) -> list[str]:
    """--launcher (or $DFLASHCTL_SGLANG_LAUNCHER) as shell words; bad quoting is a usage error."""
    source = "--launcher" if os.environ.get(LAUNCHER_ENV) != launcher else f"${LAUNCHER_ENV}"
    try:
        words = shlex.split(launcher)
    except ValueError as e:
        raise DflashError(f"{source} {launcher!r} cannot be split into words", str(e),
                          f"give {source} a command line with balanced quotes, e.g. '/usr/bin/env FOO=1 "
                          "python -m sglang.launch_server'", USAGE) from None
    if not words:
        raise DflashError(f"{source} is empty", "it names no program to run",
                          f"leave {source} out to run SGLang, or give it a command", USAGE)
    return words


PYTHON_FIX = ("pass --python the stack's interpreter, the one with SGLang (in the unit's ExecStart: "
              "`dflashctl unit --python PATH`; on NixOS the instance's package option gives "
              "<package>/bin/python)")


def check_python(python: str) -> None:
    """A missing or wrong --python is a settings error (not restarted), named as such: else the
    first probe run in it fails and the preflight blames the driver."""
    why = interpreter.problem(python)
    if why is not None:
        raise DflashError(f"--python {python} cannot run the stack", why, PYTHON_FIX, CONFIG)


def default_log_path(cfg: config.InstanceConfig, env: dict[str, str]) -> Path:
    logs = env.get("LOGS_DIRECTORY", "").split(":")[0]
    return Path(logs or tempfile.gettempdir(), f"dflash-{cfg.name}-sglang.log")


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run one SGLang instance, ready only when it decodes",
                              **cli_help.texts("serve", __doc__))
    p.add_argument("--config", required=True, metavar="FILE", help="the instance's settings JSON")
    p.add_argument("--name", help='the instance to run from a file of {"instances": {...}}')
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="interpreter with the stack (default: the one running dflashctl)")
    p.add_argument("--skip-preflight", action="store_true",
                   help="start SGLang without the preflight probes and the model-pair check "
                        "(diagnosis only)")
    p.add_argument("--log-file", metavar="PATH",
                   help="SGLang's log (default: $LOGS_DIRECTORY or the temp dir); also echoed to stderr")
    p.add_argument("--launcher", metavar="CMD", default=os.environ.get(LAUNCHER_ENV) or None,
                   help=f"for tests: run CMD instead of `python -m sglang.launch_server`, with the "
                        f"same flags (env {LAUNCHER_ENV})")
    p.add_argument("--dry-run", action="store_true",
                   help="print the SGLang command and the environment the settings give it (the fast start's "
                        "included; not what this host adds: driver, CUDA home, prebuilt kernels) as JSON, "
                        "start nothing")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        return _run(args)
    except DflashError as e:
        # Without this, `systemctl status` would keep showing the last progress line
        # ("preflight: checking ...") next to the failed unit.
        listed = getattr(e, "status", None)
        if listed:
            sdnotify.status(f"failed (exit {e.exit_code}): {listed}", limit=preflight.STATUS_LIMIT)
        else:
            sdnotify.status(failure_status(e), limit=STATUS_FAILURE_LIMIT)
        raise


STATUS_FAILURE_LIMIT = 400  # what failed plus its fix; longer than a progress line


def failure_status(e: DflashError) -> str:
    """One line for systemd's StatusText: the exit code, what failed, and the fix."""
    text = f"failed (exit {e.exit_code}): {e.what}"
    return text + (f"; fix: {e.fix}" if e.fix else "")


def _run(args) -> int:
    env = dict(os.environ)
    output.check(args.log_file, "--log-file")
    cfg = config.load(args.config, args.name)
    for w in warnings_for(cfg):
        say(f"warning: {w}")
    if args.launcher is not None:
        launcher_words(args.launcher)  # before anything starts: a quoting mistake is a usage error
    if args.dry_run:
        argv = launch_argv(cfg, args.python, None, args.launcher)
        print(json.dumps({"argv": argv, "env": settings_env(cfg)}, indent=2))
        return OK
    api_key = read_api_key(cfg, env)
    check_python(args.python)
    child = sglang_child_env(cfg, args.python, env, read_hf_token(cfg, env))  # PREFLIGHT_DRIVER on a mismatch
    say(child.driver_line())
    child_env = child.env
    check_models_cached(cfg, child_env, args.config)  # a file check: kept with --skip-preflight
    listen_check.check_listen(cfg.host, cfg.port)  # a socket's bind: kept too
    pre = None
    if not args.skip_preflight:  # what SGLang must not start without; the stack's imports go on beside it
        pre = preflight.Preflight(cfg, args.python, child_env, args.config, say)
        pre.before_start()
    server = Server(launch_argv(cfg, args.python, api_key, args.launcher),
                    child_env, Path(args.log_file or default_log_path(cfg, env)),
                    cfg.base_url, api_key, echo=sys.stderr, listen=(cfg.host, cfg.port))
    _rotate(server.log_path)
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _supervise(cfg, server, args.python, pre)
    except _Stop as stop:
        sdnotify.notify("STOPPING=1")
        say(f"got {signal.Signals(stop.signum).name}; stopping SGLang (process group {server.pid})")
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        rc = server.stop(STOP_GRACE_S)
        if rc is not None:
            say(f"SGLang stopped with status {_describe(rc)}")
        elif server.proc is None:
            say("SGLang was not started")
        else:  # Server.stop's SIGKILL did not end it either
            say(f"SGLang (pid {server.pid}) did not exit {STOP_GRACE_S:.0f} s after SIGTERM nor {KILL_WAIT_S:.0f} s "
                "after SIGKILL: a process stuck in the driver; check `ps -o stat,wchan -p PID` and the GPU")
        return OK
    except DflashError as e:
        sdnotify.status(f"failed: {e.what}")
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if pre is not None:
            pre.stop()  # probes still running when the start ended another way
        if server.proc is not None:
            server.stop(STOP_GRACE_S)  # no orphans, whatever ended the supervision


def _supervise(cfg: config.InstanceConfig, server: Server, python: str, pre: preflight.Preflight | None) -> int:
    indices = gpu_claim.instance_gpus(cfg, server.env)
    watch = GpuWatch(python, indices, server.env, on_note=lambda text: say(f"GPU watch: {text}"),
                     on_state=say)
    try:
        watch.start()  # inside: a stop that comes while it starts must still stop it
        return _serve(cfg, server, python, watch, indices, pre)
    finally:
        watch.stop()


def _serve(cfg: config.InstanceConfig, server: Server, python: str, watch: GpuWatch, indices: list[int],
           pre: preflight.Preflight | None) -> int:
    say(f"starting SGLang for {cfg.model} on {cfg.base_url} (log: {server.log_path})")
    server.start()
    gpu = None
    if cfg.stall_timeout_sec:  # GPU memory that grows is start-up progress too (service/stall.py)
        gpu = GpuMemory(lambda: gpus.read(python, timeout=10.0, env=server.env), indices).start()

    def stop_error() -> DflashError | None:
        if watch.failure:
            return gpu_failed(server, watch.failure, "while starting")
        failed = pre.failed_beside() if pre is not None else None
        return preflight_failed(server, failed, python) if failed else None
    try:
        took = server.wait_ready(
            cfg.start_timeout_sec,
            on_progress=lambda t, line: sdnotify.status(f"loading ({t:.0f} s): {line}"),
            stall_timeout=cfg.stall_timeout_sec, gpu=gpu, abort=stop_error)
        failed = pre.finish() if pre is not None else None  # no READY=1 before the stack's checks pass
        if failed:
            raise preflight_failed(server, failed, python)
    except DflashError as e:
        if e.exit_code == SERVER_DIED_BEFORE_READY:
            if pre is not None and (failed := pre.finish()):  # the import SGLang died of, named
                raise preflight_failed(server, failed, python) from None
            if watch.wait_failure(DEATH_CAUSE_WAIT_S):
                raise gpu_failed(server, watch.failure, "while starting") from None
        raise
    finally:
        if gpu is not None:
            gpu.stop()
    sdnotify.notify("READY=1")
    say(f"ready after {took:.1f} s: {server.ready_by}")
    while True:
        rc = server.wait(0.2)
        failure = watch.failure or (watch.wait_failure(DEATH_CAUSE_WAIT_S) if rc is not None else None)
        if failure is not None:
            raise gpu_failed(server, failure, "while serving")
        if rc is not None:
            raise DflashError(f"SGLang exited with status {_describe(rc)} while serving",
                              "its log ends with:\n" + _indent(server.log_tail()),
                              f"read the log above (full log: {server.log_path}); systemd restarts "
                              "the service with backoff", SERVER_DIED_AFTER_READY)


def gpu_failed(server: Server, failure: GpuFailure, when: str) -> DflashError:
    """Stop SGLang (it would hang in CUDA or die naming nothing) and say which GPU failed and why:
    the router stops sending here once the port is closed, the other instances keep serving."""
    say(f"{failure.label} failed {when}: {failure.finding.what}; stopping SGLang")
    rc = server.stop(GPU_FAILED_GRACE_S)
    stopped = "SGLang was stopped" if rc is not None else "SGLang did not exit (stuck in the driver)"
    err = DflashError(f"{failure.what()} ({when}); {stopped}",
                      "the GPU watch saw it (NVML); the router sends no more requests here once this instance's "
                      "port is closed, and the other instances keep serving",
                      f"{failure.finding.fix}. systemd restarts the instance; its preflight refuses the GPU "
                      f"(exit {PREFLIGHT_GPU_FAULT}) until it is healthy again", SERVER_GPU_FAILED)
    err.status = f"{err.what}; fix: {err.fix}"  # run() leaves this in StatusText, not cut to one line's length
    return err


def preflight_failed(server: Server, checks: list, python: str) -> DflashError:
    """A check of the stack, run beside SGLang's start, failed: stop SGLang (it would fail the same
    way, or serve from a broken stack) and report every check as a preflight that failed before it."""
    died = server.proc.poll()
    rc = died if died is not None else server.stop(PREFLIGHT_FAILED_GRACE_S)
    what = ("SGLang, started beside the stack's checks, " + (f"had exited with status {_describe(rc)}" if died is not None
            else "was stopped" if rc is not None else "did not exit (stuck in the driver)"))
    return preflight.failure(checks, python, what)


def _rotate(log: Path) -> None:
    """Keep the previous start's log as <log>.1: the log tail must be this start's."""
    if log.exists():
        log.replace(log.with_name(log.name + ".1"))
