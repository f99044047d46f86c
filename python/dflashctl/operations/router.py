"""`dflashctl router --config FILE`: SGLang's router (sglang-router 0.3.2) in front of a host's instances.

The router settings are a JSON file (`dflashctl router-unit` writes it from the instances' settings;
keys as a future `services.dflash.router` would name them). This module is their schema, the only
mapping to the router's flags, and the command the unit runs: it reads the API keys from systemd's
credentials and replaces itself with `<python> -m sglang_router.launch_router FLAGS` (the router's
own environment, nix/router-lock.json), so SIGTERM reaches the router, which drains for `drainSec`.
"""

import json
import os
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from dflashctl import cli_help
from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import interpreter
from dflashctl.operations import unit_data
from dflashctl.operations.router_admin import RouterAdmin
from dflashctl.service import config

POLICIES = ("round_robin", "cache_aware", "power_of_two", "random")
LOG_LEVELS = ("debug", "info", "warn", "error")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ADMIN_KEY_ID = "dflash-admin"


def defaults() -> dict:
    return unit_data.router_unit_data()["defaults"]


@dataclass(frozen=True)
class RouterConfig:
    workers: tuple[str, ...]  # URLs: this host's instances, then remote workers
    host: str
    port: int
    metrics_host: str
    metrics_port: int
    policy: str
    health_check_interval_sec: int
    health_check_timeout_sec: int
    health_failure_threshold: int
    health_success_threshold: int
    circuit_breaker_failures: int
    circuit_breaker_open_sec: int
    retries: int
    request_timeout_sec: int
    worker_startup_timeout_sec: int
    drain_sec: int
    api_key_file: str | None = None  # clients' key; sglang-router 0.3.2 sends the same key to workers
    admin_api_key_file: str | None = None  # the admin API (/workers, ...); open when null
    log_level: str = "info"
    extra_args: tuple[str, ...] = ()
    instance_units: tuple[str, ...] = field(default=())  # dflash-<name>.service of the local workers

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def _url(v):
    if not isinstance(v, str):
        raise ValueError("a list of http:// URLs, e.g. [\"http://10.0.0.2:30000\"]")
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username:
        raise ValueError(f"a list of http:// URLs of the form http://HOST:PORT ({v!r} is not)")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"a list of URLs with a valid port ({v!r} has none)") from None
    return v.rstrip("/")


def _workers(v):
    if not isinstance(v, list) or len(v) > config.MAX_ITEMS:
        raise ValueError(f"a list of at most {config.MAX_ITEMS} worker URLs")
    urls = [_url(u) for u in v]
    if len(set(urls)) != len(urls):
        raise ValueError("a list without repeats")
    return tuple(urls)


def _units(v):
    if not isinstance(v, list) or any(not isinstance(u, str) or not u.endswith(".service") for u in v):
        raise ValueError('a list of unit names, e.g. ["dflash-a.service"]')
    return tuple(v)


I = config._int  # the settings' own checkers, so one message style
KEYS = {
    "workers": ("workers", _workers),
    "instanceUnits": ("instance_units", _units),
    "host": ("host", config._str),
    "port": ("port", I(1, 65535)),
    "metricsHost": ("metrics_host", config._str),
    "metricsPort": ("metrics_port", I(1, 65535)),
    "policy": ("policy", config._choice(*POLICIES)),
    "healthCheckIntervalSec": ("health_check_interval_sec", I(1, 3600)),
    "healthCheckTimeoutSec": ("health_check_timeout_sec", I(1, 3600)),
    "healthFailureThreshold": ("health_failure_threshold", I(1, 100)),
    "healthSuccessThreshold": ("health_success_threshold", I(1, 100)),
    "circuitBreakerFailures": ("circuit_breaker_failures", I(1, 1000)),
    "circuitBreakerOpenSec": ("circuit_breaker_open_sec", I(1, 3600)),
    "retries": ("retries", I(0, 20)),
    "requestTimeoutSec": ("request_timeout_sec", I(1, 86400)),
    "workerStartupTimeoutSec": ("worker_startup_timeout_sec", I(1, 7 * 86400)),
    "drainSec": ("drain_sec", I(0, 3600)),
    "apiKeyFile": ("api_key_file", config._opt(config._abs_path)),
    "adminApiKeyFile": ("admin_api_key_file", config._opt(config._abs_path)),
    "logLevel": ("log_level", config._choice(*LOG_LEVELS)),
    "extraArgs": ("extra_args", config._extra_args),
}
# Flags owned by a setting above (or by the way the router runs here): refused in extraArgs.
OWNED_FLAGS = {
    "--worker-urls": "workers", "--host": "host", "--port": "port", "--prometheus-host": "metricsHost",
    "--prometheus-port": "metricsPort", "--policy": "policy",
    "--health-check-interval-secs": "healthCheckIntervalSec",
    "--health-check-timeout-secs": "healthCheckTimeoutSec",
    "--health-failure-threshold": "healthFailureThreshold",
    "--health-success-threshold": "healthSuccessThreshold",
    "--cb-failure-threshold": "circuitBreakerFailures", "--cb-timeout-duration-secs": "circuitBreakerOpenSec",
    "--retry-max-retries": "retries", "--disable-retries": "retries",
    "--request-timeout-secs": "requestTimeoutSec",
    "--worker-startup-timeout-secs": "workerStartupTimeoutSec",
    "--worker-startup-check-interval": "healthCheckIntervalSec",
    "--shutdown-grace-period-secs": "drainSec", "--api-key": "apiKeyFile",
    "--control-plane-api-keys": "adminApiKeyFile", "--log-level": "logLevel",
}


def problems_of(d) -> tuple[list[str], dict]:
    if not isinstance(d, dict):
        return ["the router settings must be a JSON object"], {}
    problems = config._unknown(d, KEYS, "") + config._control_characters(d, "")
    kw = {**{KEYS[k][0]: v for k, v in defaults().items()}, **config._convert(d, KEYS, "", problems)}
    if "workers" not in d:
        problems.append("workers: required (the instances' URLs, e.g. [\"http://127.0.0.1:30000\"])")
    if problems:
        return problems, kw
    if not kw["workers"]:
        problems.append("workers: empty; list at least one instance (`dflashctl router-unit --instance FILE`)")
    if kw["port"] == kw["metrics_port"]:
        problems.append(f"metricsPort: {kw['metrics_port']} is the router's port too; choose another")
    for url in kw["workers"]:
        parts = urlsplit(url)
        if parts.hostname in LOOPBACK + ("0.0.0.0", "::") and parts.port in (kw["port"], kw["metrics_port"]):
            problems.append(f"port: {parts.port} is a worker's port ({url}); choose another for the router "
                            "(default 30080; instances default to 30000 and up)")
    if kw["health_check_timeout_sec"] < 2:
        problems.append("healthCheckTimeoutSec: at least 2 (SGLang's /health takes about 1 s under load; "
                        "with 1 the router admitted no worker at all on the H200)")
    if kw["host"] not in LOOPBACK and kw.get("admin_api_key_file") is None:
        problems.append(f"adminApiKeyFile: required when host is {kw['host']!r}: the router's admin API "
                        "(/workers) can add and remove workers, i.e. redirect every request; without a key "
                        "anyone who reaches the port could; set adminApiKeyFile or keep host 127.0.0.1")
    for arg in kw.get("extra_args", ()):
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            problems.append(f"extraArgs: {flag} is set by the setting {OWNED_FLAGS[flag]}; use that setting")
    return problems, kw


def from_dict(d, origin: str = "router settings") -> RouterConfig:
    problems, kw = problems_of(d)
    if problems:
        raise DflashError(f"invalid router settings in {origin}",
                          f"{len(problems)} problem(s)\n  - " + "\n  - ".join(problems),
                          "correct the settings above (docs/service.md, \"Router\", lists them)", CONFIG)
    return RouterConfig(**kw)


def to_dict(cfg: RouterConfig) -> dict:
    """The settings file `dflashctl router-unit` writes (every key, so the file says what runs)."""
    out = {}
    for key, (attr, _) in KEYS.items():
        value = getattr(cfg, attr)
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def build_argv(cfg: RouterConfig, python: str, api_key: str | None, admin_key: str | None) -> list[str]:
    """The router's command line: the only place that knows sglang-router's flags."""
    argv = [python, "-m", "sglang_router.launch_router",
            "--host", cfg.host, "--port", str(cfg.port),
            "--prometheus-host", cfg.metrics_host, "--prometheus-port", str(cfg.metrics_port),
            "--worker-urls", *cfg.workers,
            "--policy", cfg.policy,
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(cfg.health_check_interval_sec),
            "--health-check-timeout-secs", str(cfg.health_check_timeout_sec),
            "--health-failure-threshold", str(cfg.health_failure_threshold),
            "--health-success-threshold", str(cfg.health_success_threshold),
            "--cb-failure-threshold", str(cfg.circuit_breaker_failures),
            "--cb-timeout-duration-secs", str(cfg.circuit_breaker_open_sec),
            "--request-timeout-secs", str(cfg.request_timeout_sec),
            # A worker down when the router starts is polled this often until it answers, for at most
            # workerStartupTimeoutSec; after that 0.3.2 never adds it (docs/service.md).
            "--worker-startup-timeout-secs", str(cfg.worker_startup_timeout_sec),
            "--worker-startup-check-interval", str(cfg.health_check_interval_sec),
            "--shutdown-grace-period-secs", str(cfg.drain_sec),
            "--log-level", cfg.log_level]
    argv += ["--disable-retries"] if cfg.retries == 0 else ["--retry-max-retries", str(cfg.retries)]
    if api_key:
        argv += ["--api-key", api_key]
    if admin_key:
        argv += ["--control-plane-api-keys", f"{ADMIN_KEY_ID}:dflash admin:admin:{admin_key}"]
    return argv + list(cfg.extra_args)


def masked(argv: list[str]) -> list[str]:
    out, hide = [], False
    for a in argv:
        out.append("***" if hide else a)
        hide = a in ("--api-key", "--control-plane-api-keys")
    return out


def read_keys(cfg: RouterConfig, env: dict[str, str]) -> tuple[str | None, str | None]:
    from dflashctl.service.serve import read_credential
    data = unit_data.router_unit_data()
    api = admin = None
    if cfg.api_key_file:
        api = read_credential(data["apiKeyCredential"], cfg.api_key_file, "the router's API key",
                              "apiKeyFile", env)
    if cfg.admin_api_key_file:
        admin = read_credential(data["adminApiKeyCredential"], cfg.admin_api_key_file,
                                "the router's admin API key", "adminApiKeyFile", env)
    return api, admin


def sync(cfg: RouterConfig, admin_key: str | None) -> tuple[list[str], list[str]]:
    """Make the running router's workers the settings' workers through its admin API, without a
    restart (the unit's ExecReload). Returns (added, removed)."""
    return RouterAdmin(cfg.url, admin_key).sync(list(cfg.workers))


def register(subparsers) -> None:
    p = subparsers.add_parser("router", help="run SGLang's router in front of this host's instances",
                              **cli_help.texts("router", __doc__))
    p.add_argument("--config", required=True, metavar="FILE", help="the router settings JSON")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="the router environment's interpreter (nix/router-lock.json; default: this one)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the router's argv (keys masked) and exit")
    mode.add_argument("--sync", action="store_true",
                   help="make the running router's workers the settings' ones, without a restart "
                        "(the unit's ExecReload: `systemctl reload dflash-router`)")
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = from_dict(config.read_json(args.config), origin=args.config)
    api, admin = read_keys(cfg, dict(os.environ))
    if args.sync:
        added, removed = sync(cfg, admin)
        print(f"dflashctl router: added {' '.join(added) or 'none'}; removed {' '.join(removed) or 'none'}",
              file=sys.stderr)
        return 0
    argv = build_argv(cfg, args.python, api, admin)
    if args.dry_run:
        print(json.dumps({"argv": masked(argv)}, indent=2))
        return 0
    check_python(args.python)
    print(f"dflashctl router: {cfg.url} in front of {len(cfg.workers)} worker(s): "
          + " ".join(cfg.workers), file=sys.stderr, flush=True)
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        raise DflashError(f"cannot start the router with {argv[0]}", e.strerror or str(e), PYTHON_FIX,
                          CONFIG) from None
    return 0  # not reached


PYTHON_FIX = ("pass --python the router environment's interpreter, which has sglang-router 0.3.2: one built "
              "from nix/router-lock.json (`services.dflash.router`), or a venv of `dflashctl export --lock "
              "nix/router-lock.json` (README, \"One endpoint per host: the router\"), e.g. "
              "/opt/dflash-router/bin/python")


def check_python(python: str) -> None:
    """The router's interpreter has sglang_router, asked before the exec: else Python's own "No module
    named" would be all the journal says (dflashctl's venv, the default, does not have it)."""
    why = interpreter.problem(python, ("sglang_router",))
    if why is not None:
        raise DflashError(f"--python {python} cannot run the router", why, PYTHON_FIX, CONFIG)
