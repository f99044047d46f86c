"""What `dflashctl status` reads from a host, one sample at a time: each instance and the router.

A sample asks every source once and never raises: what cannot be read is named (`missing`), so a
host without systemd, without a router, without a driver, or with metrics off still gets every row
it can fill. Sources, per instance: systemd (instance_control.Systemd.show, the one parser of
`systemctl show`), its journal (the last line that reads as an error), NVML (host/gpus.py's reader,
one child per sample; host/gpu_health.assess judges its figures), SGLang 0.5.11's own endpoints
(/model_info, /v1/loads: running and queued requests, /metrics with enableMetrics: tokens and the
speculative acceptance length); for the router, its /workers (router_admin) and its /metrics
(sglang-router 0.3.2's smg_* families); the rollout's state (rollout_state.py's file, and whether
the process that wrote it still runs). Rates come from two samples (status.py keeps them); one
sample has only counters and gauges.

Only what answers is asked further, and the instances are asked side by side, so a host where
nothing answers is read in one connection attempt per instance: an instance that does not take
the connection to /model_info is not asked for /v1/loads or /metrics, and the second sample
(`resample`) reads again only the /metrics that answered. SGLang 0.5.11 wants the API key on every
route but /health* and /metrics (its auth middleware): an instance that answers 401/403 there
answers; whether that is a problem (a key this user cannot read is not) is status.py's judgement.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.host import driver, gpu_health, gpus, hub_cache
from dflashctl.operations import canary, monitoring, rollout_state, unit_data
from dflashctl.operations.metrics_text import Metrics, ParseError
from dflashctl.operations.router import RouterConfig
from dflashctl.operations.router_admin import RouterAdmin, RouterUnreachable
from dflashctl.service import gpu_claim, serve, sglang_args, unit
from dflashctl.service.config import InstanceConfig
from dflashctl.service.instance_control import Systemd, UnitState

HTTP_TIMEOUT_S = 3.0
PARALLEL = 16  # instances asked at once: a host's instances, each a few HTTP requests
JOURNAL_LINES = 400
ERROR_LINE = re.compile(r"error|exception|traceback|fatal|failed|killed|out of memory", re.IGNORECASE)
# serve's warnings and its GPU watch's state and notes ("GPU watch: off: OSError: ..." on a host
# without NVML) name error words without being the instance's errors; a GPU the watch sees fail is
# said as "<GPU> failed ...: stopping SGLang", which still counts.
NOT_AN_ERROR = re.compile(r"^dflashctl serve: (warning|preflight warning|GPU watch): ")


def systemd_here() -> str | None:
    """None when systemd runs this host (sd_booted: /run/systemd/system exists), else why not."""
    if not os.path.isdir("/run/systemd/system"):
        return "systemd does not run this host (no /run/systemd/system)"
    if shutil.which("systemctl") is None:
        return "systemctl is not on PATH"
    return None


HEALTH_STATE = {"ok": "ok", "warn": "warn", "fail": "fault"}  # gpu_health's verdicts, as status names them


@dataclass
class InstanceSample:
    cfg: InstanceConfig
    unit_state: UnitState | None = None
    last_error: dict | None = None
    answers: bool = False  # something answered HTTP at its address (any status)
    http_status: int | None = None  # /model_info's status; None: nothing answered
    key: str = "none"  # its API key: "none" (no apiKeyFile), "read", "unreadable"
    model_info: dict | None = None
    loads: dict | None = None
    metrics: Metrics | None = None
    gpus: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass
class RouterSample:
    cfg: RouterConfig
    unit_state: UnitState | None = None
    workers: dict[str, bool] | None = None  # url -> healthy, as /workers lists them
    unreachable: bool = False  # its API did not answer at all
    metrics: Metrics | None = None
    missing: list[str] = field(default_factory=list)


@dataclass
class RolloutSample:
    dir: str
    state: dict  # state.json as the rollout wrote it (rollout_state.RolloutLock.read)
    alive: bool  # the process it names runs a rollout now


@dataclass
class Sample:
    at: float  # time.monotonic()
    wall: float  # time.time()
    instances: list[InstanceSample]
    router: RouterSample | None
    systemd: str | None  # None: available; else why not
    nvml: str | None  # None: read; else why not
    rollout: RolloutSample | None = None
    rollout_missing: str | None = None  # why no rollout state was read
    rollout_unreadable: bool = False  # there is one, but this user may not read it


def _get(url: str, path: str, key: str | None) -> tuple[int, bytes]:
    return canary.request(url, path, key, timeout=HTTP_TIMEOUT_S)


def _json(status: int, body: bytes) -> dict | None:
    if status != 200:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def last_error(unit_name: str) -> dict | None:
    """The newest line the unit's processes wrote to the journal that reads as an error (priority err
    or worse, or an error word: SGLang's and serve's lines come as info): {"time", "text"}; None if none."""
    try:
        r = subprocess.run(["journalctl", "-u", unit_name, "-n", str(JOURNAL_LINES), "-o", "json", "--no-pager",
                            "-q"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in reversed(r.stdout.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("_PID") == "1":  # systemd's own lines about the unit: its state is shown already
            continue
        text = entry.get("MESSAGE")
        if isinstance(text, list):  # journald gives non-UTF-8 messages as byte arrays
            text = bytes(text).decode(errors="replace")
        if not isinstance(text, str):
            continue
        if reads_as_error(text, str(entry.get("PRIORITY", "6"))):
            us = int(entry.get("__REALTIME_TIMESTAMP", "0") or 0)
            return {"time": iso(us / 1e6) if us else None, "text": text.strip()[:300]}
    return None


def reads_as_error(text: str, priority: str = "6") -> bool:
    """A journal line that is an error: priority err or worse, or an error word outside serve's notes."""
    if priority in ("0", "1", "2", "3"):
        return True
    return bool(ERROR_LINE.search(text)) and not NOT_AN_ERROR.match(text)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _unit_state(systemd: Systemd, name: str, missing: list[str]) -> UnitState | None:
    try:
        state = systemd.show(name)
    except DflashError as e:
        missing.append(f"unit state: {e.what} ({e.why})")
        return None
    if state.load != "loaded":
        missing.append(f"unit state: {name} is not installed (LoadState={state.load or '?'})")
    return state


def _nvml() -> tuple[dict, str | None]:
    """NVML's snapshot (probe_child.nvml_snapshot: answered GPUs, unanswered ones, the count), or why not."""
    env, found = driver.locate(dict(os.environ))
    if isinstance(found, DflashError):
        return {}, f"{found.what}: {found.why}"
    result = gpus.read(sys.executable, env=env, timeout=10.0)
    if not result.get("ok"):
        from dflashctl.host import probes
        return {}, f"NVML gave no answers ({probes.failure_text(result)})"
    return result["facts"], None


def _gpus_of(cfg: InstanceConfig, snapshot: dict) -> list[dict]:
    """A row per GPU the instance uses, the ones serve watches (service/gpu_claim.instance_gpus:
    `gpus`, else the first tpSize its environment makes visible): memory, and the verdict
    host/gpu_health.assess gives on NVML's figures; a fault there makes the instance unhealthy. A GPU
    it uses that NVML lost or does not count is a fault too, named as assess names it."""
    answered = {g["index"]: g for g in snapshot.get("gpus", [])}
    out = []
    for h in gpu_health.assess(snapshot, gpu_claim.instance_gpus(cfg, dict(cfg.environment))):
        g = answered.get(h.index, {})
        memory = g.get("memory_mib") or {}
        out.append({"index": h.index, "name": g.get("name") or h.name, "memory_used_mib": memory.get("used"),
                    "memory_total_mib": memory.get("total"), "health": HEALTH_STATE[h.status],
                    "health_detail": h.summary() + (f"; fix: {h.fix()}" if h.fix() else "")})
    return out


def sample_instance(cfg: InstanceConfig, systemd: Systemd | None, env: dict) -> InstanceSample:
    """Everything but its GPUs (`sample` adds those from the host's one NVML reading)."""
    s = InstanceSample(cfg)
    name = unit.unit_name(cfg)
    if systemd is not None:
        s.unit_state = _unit_state(systemd, name, s.missing)
        s.last_error = last_error(name)
    key = None
    if cfg.api_key_file is not None:
        try:
            key, s.key = serve.read_api_key(cfg, env), "read"
        except DflashError as e:
            s.key = "unreadable"
            s.missing.append(f"API key: {e.what} ({e.why}); /model_info and /v1/loads need it: run status as a "
                             "user who can read it (root)")
    _sample_http(s, key)
    return s


def _sample_http(s: InstanceSample, key: str | None) -> None:
    """/model_info, then /v1/loads and /metrics only where something answered."""
    cfg = s.cfg
    if not cfg.enable_metrics:
        s.missing.append("metrics: off (enableMetrics is false): tokens/s and acceptance from /v1/loads")
    status, body = _get(cfg.base_url, "/model_info", key)
    if status == 0:  # nothing takes the connection: the other routes would fail the same way
        s.missing.append(f"SGLang: {cfg.base_url} does not answer ({body.decode(errors='replace')[:120]})")
        return
    s.answers, s.http_status, s.model_info = True, status, _json(status, body)
    if status not in (401, 403):  # without the key /v1/loads refuses as /model_info did
        s.loads = _json(*_get(cfg.base_url, "/v1/loads?include=core", key))
    if cfg.enable_metrics:
        read_metrics(s)


def scrape(url: str, missing: list[str]) -> Metrics | None:
    """`url`/metrics as Prometheus reads it (no key: SGLang 0.5.11 and the router want none there);
    None, with what went wrong added to `missing`, when it does not answer or is not its text."""
    status, body = _get(url, "/metrics", None)
    if status != 200:
        missing.append(f"metrics: {url}/metrics does not answer "
                       f"({f'HTTP {status}' if status else body.decode(errors='replace')[:120]})")
        return None
    try:
        return Metrics.from_text(body.decode(errors="replace"))
    except ParseError as e:
        missing.append(f"metrics: {url}/metrics is not Prometheus text ({e})")
        return None


def read_metrics(s: InstanceSample) -> None:
    s.metrics = scrape(s.cfg.base_url, s.missing)


def sample_router(cfg: RouterConfig, admin_key: str | None, key_problem: str | None,
                  systemd: Systemd | None) -> RouterSample:
    s = RouterSample(cfg)
    if systemd is not None:
        s.unit_state = _unit_state(systemd, "dflash-router.service", s.missing)
    if key_problem:
        s.missing.append(f"workers: {key_problem}")
    else:
        try:
            s.workers = {w.url: w.healthy for w in RouterAdmin(cfg.url, admin_key, timeout=HTTP_TIMEOUT_S).workers()}
        except RouterUnreachable as e:
            s.unreachable = True
            s.missing.append(f"workers: {e.what} ({e.why})")
        except DflashError as e:
            s.missing.append(f"workers: {e.what} ({e.why})")
    _router_metrics(s)
    return s


def _router_metrics(s: RouterSample) -> None:
    url = "http://" + monitoring.target(s.cfg.metrics_host, s.cfg.metrics_port)  # where Prometheus scrapes it
    s.metrics = scrape(url, s.missing)


def model_commit(cfg: InstanceConfig) -> str | None:
    """The commit the instance's revision resolves to in its hub cache (None: local, or not there)."""
    if hub_cache.is_local(cfg.model):
        return None
    try:
        return hub_cache.inspect(sglang_args.cache_env(cfg), cfg.model, cfg.model_revision).commit
    except (OSError, ValueError):
        return None


def rollout_dirs(given: str | None) -> list[Path]:
    """Where a rollout keeps its state: --state-dir, else where `dflashctl rollout` run by this user
    keeps it, then the system's (dflash-rollout.service's StateDirectory, where root's goes)."""
    if given:
        return [Path(given)]
    system = Path("/var/lib", unit_data.rollout_unit_data()["service"]["StateDirectory"])
    own = rollout_state.default_dir()
    return [own] if own == system else [own, system]


def read_rollout(dirs: list[Path]) -> tuple[RolloutSample | None, str | None, bool]:
    """The state of the first directory that has one, and whether its rollout still runs; else
    (None, why not, whether there is one this user may not read: named, not guessed at)."""
    for d in dirs:
        path = d / "state.json"
        try:
            path.stat()
        except FileNotFoundError:
            continue
        except OSError as e:
            return None, f"{d}: {e.strerror} (run as root to see a rollout's state)", True
        if not os.access(path, os.R_OK):
            return None, f"{path}: not readable by this user (run as root to see a rollout's state)", True
        state = rollout_state.RolloutLock(d).read()
        if not state:
            return None, f"{path} is not a rollout state this dflashctl reads (version {rollout_state.STATE_VERSION})", True
        return RolloutSample(str(d), state, rollout_runs(state.get("pid"))), None, False
    return None, f"no rollout has run here (no state.json in {' or '.join(map(str, dirs))})", False


def rollout_runs(pid) -> bool:
    """The pid is a live `dflashctl rollout` (not a process that reused the pid, not a zombie)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # it runs, as another user whose command line is hidden here
        return True
    return b"rollout" in cmdline.split(b"\0")


def sample(cfgs: list[InstanceConfig], router_cfg: RouterConfig | None, admin_key: str | None = None,
           key_problem: str | None = None, use_systemd: bool = True, state_dirs: list[Path] | None = None) -> Sample:
    why_not = systemd_here() if use_systemd else "--no-systemd"
    systemd = Systemd() if why_not is None else None
    env = dict(os.environ)
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(cfgs) + 2))) as pool:
        gpus_read = pool.submit(_nvml)  # a child process: read beside the HTTP requests
        asked = [pool.submit(sample_instance, c, systemd, env) for c in cfgs]
        rt = pool.submit(sample_router, router_cfg, admin_key, key_problem, systemd) if router_cfg else None
        instances = [f.result() for f in asked]
        router = rt.result() if rt is not None else None
        nvml, nvml_missing = gpus_read.result()
    for i in instances:
        if not nvml_missing:  # otherwise named once for the host
            i.gpus = _gpus_of(i.cfg, nvml)
    rollout, rollout_missing, unreadable = read_rollout(state_dirs or [])
    return Sample(time.monotonic(), time.time(), instances, router, why_not, nvml_missing, rollout,
                  rollout_missing, unreadable)


def has_counters(prev: Sample) -> bool:
    """Some /metrics answered: a second sample gives rates (else there is nothing to wait for)."""
    return any(i.metrics is not None for i in prev.instances) or bool(prev.router and prev.router.metrics)


def resample(prev: Sample) -> Sample:
    """A second sample for rates: the /metrics that answered in `prev` read again, the rest as it was."""
    instances = [dataclasses.replace(i, missing=list(i.missing)) for i in prev.instances]
    router = dataclasses.replace(prev.router, missing=list(prev.router.missing)) if prev.router else None
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(instances) + 1))) as pool:
        done = [pool.submit(read_metrics, i) for i in instances if i.metrics is not None]
        if router is not None and router.metrics is not None:
            done.append(pool.submit(_router_metrics, router))
        for f in done:
            f.result()
    return dataclasses.replace(prev, at=time.monotonic(), wall=time.time(), instances=instances, router=router)
