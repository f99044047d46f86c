"""The service under a real systemd: a Debian container booted with systemd-nspawn (the `systemd` tier).

Each scenario installs one instance's unit in the container, drives it with systemctl and asserts
systemd's own view of it (`systemctl show` properties, `journalctl -u` lines), not only dflashctl's
output. The unit text comes from `dflashctl unit` (run inside the container, against its systemd)
or from the directives the NixOS module hands to NixOS (nix/lib/service-unit.nix through
tests/nix_unit.py); everything else is the same.
SGLang is the stand-in server (tests/data/service/standin_server.py) except in the broken-host
scenario, where the real preflight runs on a host without an NVIDIA driver.

Not provable here: device access. DevicePolicy=closed is not enforced inside the container (it
does not block /dev/zero there), so DeviceAllow is covered by resolving it against recorded
/proc/devices (tests/service/test_unit.py), and for real on the GPU host.
"""

import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from dflashctl import errors
import nix_unit
from dflashctl.service import unit as unit_mod
from systemd_container import SUITES, Container, ensure_root, unavailable
from rollout_harness import QUICK_CANARY

HERE = Path(__file__).parent.parent
REPO = HERE.parent
STANDIN = HERE / "data" / "service" / "standin_server.py"
VENV = "/opt/dflash"  # dflashctl's venv in the container
DFLASHCTL = f"{VENV}/bin/dflashctl"
TEST_DIR = "/opt/dflash-test"
LAUNCHER = f"{VENV}/bin/python {TEST_DIR}/standin_server.py"
WAIT_S = 60  # a bound on every wait below; no scenario should come near it
SERVER_STALLED = getattr(errors, "SERVER_STALLED", 93)  # issue 15 adds it

pytestmark = [pytest.mark.systemd, pytest.mark.slow]


def _suites() -> list[str]:
    return os.environ.get("DFLASH_SYSTEMD_SUITES", "trixie,bookworm").split(",")


# --- the container ----------------------------------------------------------------------------------


@pytest.fixture(scope="session", params=_suites())
def container(request, tmp_path_factory):
    reason = unavailable()
    if reason:
        if os.environ.get("DFLASH_REQUIRE_SYSTEMD") == "1":
            pytest.fail(f"tests/run requires the systemd tier here, but: {reason}")
        pytest.skip(f"systemd tier: {reason}")
    suite = request.param
    if suite not in SUITES:
        pytest.fail(f"DFLASH_SYSTEMD_SUITES: unknown suite {suite!r} (known: {', '.join(SUITES)})")
    root = ensure_root(suite)
    c = Container(root, tmp_path_factory.mktemp(f"nspawn-{suite}") / "console.log")
    request.addfinalizer(c.shutdown)  # before boot: a failed boot is cleaned up too
    booted = c.boot()
    started = time.monotonic()
    c.suite, c.systemd = suite, SUITES[suite]
    c.copy_tree(REPO / "python", "/opt/dflash-src")
    c.write(f"{TEST_DIR}/standin_server.py", STANDIN.read_text())
    c.write(f"{TEST_DIR}/standin_metrics.py", STANDIN.with_name("standin_metrics.py").read_text())  # its /metrics
    c.write(f"{TEST_DIR}/instance-metrics.txt", (HERE / "data" / "metrics" / "h200" / "instance-metrics.txt").read_text())
    for facts in ("strict_args.py", "server-args-0.5.11.json"):  # the stand-in parses argv as SGLang 0.5.11
        c.write(f"{TEST_DIR}/{facts}", (HERE / "data" / "sglang" / facts).read_text())
    # Debian's own packaging and setuptools, no package index: the container needs no network.
    c.run(["python3", "-m", "venv", "--system-site-packages", VENV])
    c.run([f"{VENV}/bin/pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
           "/opt/dflash-src"], timeout=180)
    version = c.run(["systemctl", "--version"]).stdout.split()[1]
    assert version == str(SUITES[suite]), version
    print(f"\nsystemd tier: {suite} (systemd {version}) booted in {booted:.1f} s, "
          f"dflashctl installed in {time.monotonic() - started:.1f} s")
    return c


# --- unit text sources ------------------------------------------------------------------------------


def dflashctl_unit_text(c: Container, name: str, settings: dict) -> str:
    """What a user on a non-NixOS host runs: `dflashctl unit`, against the container's systemd."""
    return c.run([DFLASHCTL, "unit", "--config", f"/etc/dflash/{name}.json", "--dflashctl", DFLASHCTL,
                  "--config-path", f"/etc/dflash/{name}.json"]).stdout


def nixos_module_text(c: Container, name: str, settings: dict) -> str:
    """The unit of the module's directives (nix/lib/service-unit.nix), pointed at the container's
    dflashctl and settings file."""
    options = {k: v for k, v in settings.items() if k != "name"}  # the attribute name is the name
    text = nix_unit.unit_text({name: options}, name)
    return adapt_nixos_unit(text, f"{DFLASHCTL} serve --config /etc/dflash/{name}.json")


def adapt_nixos_unit(text: str, exec_start: str) -> str:
    """ExecStart pointed at the container's dflashctl; everything else (hardening, restart policy,
    credentials, directories) is kept as the module's directives give it."""
    return "".join(f"ExecStart={exec_start}\n" if line.startswith("ExecStart=") else line + "\n"
                   for line in text.splitlines())


UNIT_SOURCES = {"dflashctl_unit": dflashctl_unit_text, "nixos_module": nixos_module_text}


@pytest.fixture(params=list(UNIT_SOURCES))
def unit_source(request):
    return request.param


# --- one instance -----------------------------------------------------------------------------------


class Instance:
    def __init__(self, c: Container, name: str):
        self.c, self.name, self.unit = c, name, f"dflash-{name}.service"
        self.home = f"/var/cache/dflash-{name}"  # CacheDirectory=%N, HOME and HF_HOME by default
        self.sglang_log = f"/var/log/dflash-{name}/dflash-{name}-sglang.log"  # LogsDirectory=%N

    def systemctl(self, *args, check=False, timeout=WAIT_S):
        return self.c.run(["systemctl", *args], check=check, timeout=timeout)

    def start(self):
        """`systemctl start`: blocks until READY=1 (Type=notify) or the start failed."""
        return self.systemctl("start", self.unit, timeout=WAIT_S + 30)

    def show(self, *props) -> dict[str, str]:
        out = self.c.run(["systemctl", "show", self.unit, *(f"--property={p}" for p in props)]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for(self, predicate, what: str, timeout: float = WAIT_S, props=("ActiveState", "SubState")):
        """Poll `systemctl show` until predicate(props) holds; fail with the last view and the journal."""
        end = time.monotonic() + timeout
        while True:
            view = self.show(*props)
            if predicate(view):
                return view
            if time.monotonic() > end:
                pytest.fail(f"{self.unit}: not {what} after {timeout} s; last {view}\n{self.journal()}")
            time.sleep(0.1)

    def journal(self, *args) -> str:
        self.c.run(["journalctl", "--sync"], check=False)
        return self.c.run(["journalctl", "-u", self.unit, "--no-pager", "-o", "cat", *args]).stdout

    def read(self, inside: str) -> str:
        return self.c.run(["cat", inside]).stdout

    def processes(self) -> list[dict]:
        """The unit's processes, read from its cgroup: pid and command line."""
        cg = self.show("ControlGroup")["ControlGroup"]
        script = ("import json,sys,os\n"
                  "for base in ('/sys/fs/cgroup/unified', '/sys/fs/cgroup', '/sys/fs/cgroup/systemd'):\n"
                  "    p = base + sys.argv[1] + '/cgroup.procs'\n"
                  "    if sys.argv[1] and os.path.exists(p):\n"
                  "        pids = [int(x) for x in open(p).read().split()]\n"
                  "        break\n"
                  "else:\n"
                  "    pids = []\n"
                  "out = []\n"
                  "for pid in pids:\n"
                  "    try: out.append({'pid': pid, 'cmd': open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ')})\n"
                  "    except OSError: pass\n"
                  "print(json.dumps(out))\n")
        return json.loads(self.c.run(["python3", "-c", script, cg]).stdout)


def all_processes(c: Container) -> dict[int, str]:
    """Every process in the container: pid -> command line."""
    script = ("import json, os\n"
              "out = {}\n"
              "for p in os.listdir('/proc'):\n"
              "    if p.isdigit():\n"
              "        try: out[p] = open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ')\n"
              "        except OSError: pass\n"
              "print(json.dumps(out))\n")
    return {int(k): v for k, v in json.loads(c.run(["python3", "-c", script]).stdout).items()}


_ports = iter(range(31000, 32000))


def instance_name(scenario: str, unit_source: str) -> str:
    return f"{scenario}-{'u' if unit_source == 'dflashctl_unit' else 'n'}"


@pytest.fixture
def deploy(container, unit_source):
    """deploy(scenario, standin={...}, settings={...}, preflight=False, dropin="") -> an Instance, not started."""
    made: list[Instance] = []

    def make(scenario: str, standin: dict | None = None, settings: dict | None = None,
             preflight: bool = False, dropin: str = "") -> Instance:
        name = instance_name(scenario, unit_source)
        inst = Instance(container, name)
        made.append(inst)
        env = {f"STANDIN_{k.upper()}": str(v) for k, v in (standin or {}).items()}
        env.setdefault("STANDIN_OK_FILE", f"{inst.home}/ok")
        env.setdefault("STANDIN_ARGV_FILE", f"{inst.home}/argv.json")
        cfg = {"name": name, "model": "stand-in", "port": next(_ports), "gpus": [0],
               "startTimeoutSec": 120, "environment": env, **(settings or {})}
        container.write(f"/etc/dflash/{name}.json", json.dumps(cfg, indent=2))
        text = UNIT_SOURCES[unit_source](container, name, cfg)
        container.write(f"/etc/systemd/system/{inst.unit}", text)
        inst.text = text
        parts = ["[Service]"]
        if not preflight:  # the stand-in has no torch: start it as `serve --skip-preflight --launcher`
            exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
            parts += [f"Environment={shlex.quote('DFLASHCTL_SGLANG_LAUNCHER=' + LAUNCHER)}",
                      "ExecStart=", f"{exec_start} --skip-preflight"]
        container.write(f"/etc/systemd/system/{inst.unit}.d/test.conf", "\n".join(parts) + "\n" + dropin)
        container.run(["systemctl", "daemon-reload"])
        return inst

    yield make
    for inst in made:  # leave nothing running, whatever the test did
        inst.systemctl("stop", inst.unit)
        inst.systemctl("reset-failed", inst.unit)
        container.run(["rm", "-rf", f"/etc/systemd/system/{inst.unit}", f"/etc/systemd/system/{inst.unit}.d"])
    container.run(["systemctl", "daemon-reload"])


def usec(span: str) -> float:
    """systemd's rendering of a time span ("5min 30s", "500ms", "1.500000s") in seconds."""
    units = {"us": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*(μs|us|ms|min|s|h)", span):
        total += float(number) * units[unit]
    return total


# --- scenarios --------------------------------------------------------------------------------------


def test_broken_host_fails_fast_without_restart_and_says_why(deploy):
    """No NVIDIA driver in the container: the real preflight refuses, systemd does not restart."""
    inst = deploy("broken", preflight=True)
    r = inst.start()
    assert r.returncode != 0, "systemctl start succeeded on a host without a driver"
    view = inst.show("ActiveState", "Result", "ExecMainStatus", "NRestarts", "StatusText")
    assert view["ActiveState"] == "failed" and view["Result"] == "exit-code", view
    assert int(view["ExecMainStatus"]) == errors.PREFLIGHT_DRIVER, view
    status = view["StatusText"]
    assert status.startswith(f"failed (exit {errors.PREFLIGHT_DRIVER}): preflight: "), view
    assert ". driver: " in status and "fix: " in status, view  # every failure listed with its fix
    # RestartSec later, still failed and never restarted: RestartPreventExitStatus holds 85.
    restart_sec = usec(inst.show("RestartUSec")["RestartUSec"])
    time.sleep(restart_sec + 1)
    view = inst.show("ActiveState", "NRestarts")
    assert view == {"ActiveState": "failed", "NRestarts": "0"}, view
    journal = inst.journal()
    assert "checks failed; SGLang was not started" in journal and "fix: " in journal
    assert "fix:" in journal
    assert "standin" not in journal  # SGLang was never started


def test_start_blocks_until_ready(deploy):
    inst = deploy("healthy", standin={"ready_after": 3})
    r = inst.start()
    assert r.returncode == 0, r.stderr + inst.journal()
    view = inst.show("ActiveState", "SubState", "StatusText", "ExecMainStartTimestampMonotonic",
                     "ActiveEnterTimestampMonotonic", "Type", "NotifyAccess")
    assert (view["ActiveState"], view["SubState"]) == ("active", "running"), view
    assert (view["Type"], view["NotifyAccess"]) == ("notify", "main"), view
    assert view["StatusText"].startswith("ready after "), view
    # systemd made the unit active only once the stand-in had answered /health_generate with 200.
    assert inst.read(f"{inst.home}/ok").startswith("200 ")
    waited = (int(view["ActiveEnterTimestampMonotonic"]) - int(view["ExecMainStartTimestampMonotonic"])) / 1e6
    assert waited >= 3, view
    assert "decoded a token" in inst.journal()


def test_configured_backoff_as_systemd_reads_it(deploy, unit_source):
    """The unit's restart policy, as the container's systemd parsed it (257 knows RestartSteps)."""
    inst = deploy("policy")
    data = unit_mod.unit_data()
    s, u = data["service"], data["unit"]
    view = inst.show("Restart", "RestartUSec", "RestartSteps", "RestartMaxDelayUSec", "StartLimitBurst",
                     "StartLimitIntervalUSec", "RestartPreventExitStatus", "KillMode", "TimeoutStopUSec")
    assert view["Restart"] == s["Restart"]
    assert usec(view["RestartUSec"]) == usec(s["RestartSec"])
    assert int(view["StartLimitBurst"]) == u["StartLimitBurst"]
    assert usec(view["StartLimitIntervalUSec"]) == u["StartLimitIntervalSec"]
    assert sorted(int(x) for x in view["RestartPreventExitStatus"].split()) == sorted(errors.NO_RESTART)
    assert view["KillMode"] == s["KillMode"]
    assert usec(view["TimeoutStopUSec"]) == usec(s["TimeoutStopSec"])
    if inst.c.systemd >= data["minSystemd"]["RestartSteps"]:
        assert int(view["RestartSteps"]) == s["RestartSteps"]
        assert usec(view["RestartMaxDelayUSec"]) == usec(s["RestartMaxDelaySec"])
    elif unit_source == "dflashctl_unit":  # left out for this systemd (the module targets NixOS's, >= 254)
        assert not re.search(r"^Restart(Steps|MaxDelaySec)=", inst.text, re.M)


# Shorter than the unit's (5 s growing to 300 s, 5 starts per 30 min), so the whole ladder and the
# start limit fit in a test: the growth rule and the limit are systemd's; these numbers only scale
# them (the unit's own are checked as parsed, above).
FAST_BURST = 4
FAST_BACKOFF = f"RestartSec=500ms\nRestartSteps=3\nRestartMaxDelaySec=4s\n[Unit]\nStartLimitBurst={FAST_BURST}\n"


def expected_delay(n: int, steps: bool, first=0.5, cap=4.0, n_steps=3) -> float:
    """systemd's delay before restart number n (1-based): first * (cap/first)^((n-1)/steps), at most
    cap (systemd >= 254); a constant RestartSec on older systemd, which has no RestartSteps."""
    return min(cap, first * (cap / first) ** ((n - 1) / n_steps)) if steps else first


def test_crash_after_ready_restarts_with_backoff_until_the_start_limit(deploy, container):
    steps = container.systemd >= 254  # RestartSteps, RestartMaxDelaySec, RestartUSecNext
    inst = deploy("crash", standin={"mode": "die-after-ready", "ready_after": 0.2, "die_after": 0.3},
                  dropin=FAST_BACKOFF if steps else f"RestartSec=500ms\n[Unit]\nStartLimitBurst={FAST_BURST}\n")
    assert inst.start().returncode == 0
    seen: dict[int, float] = {}  # restart number -> RestartUSecNext systemd announced for it
    burst = int(inst.show("StartLimitBurst")["StartLimitBurst"])
    assert burst == FAST_BURST
    props = ["ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus"] + (["RestartUSecNext"] if steps else [])
    end = time.monotonic() + WAIT_S + sum(expected_delay(n, steps) for n in range(1, burst + 1))
    while True:
        view = inst.show(*props)
        if view["SubState"] == "auto-restart":
            assert int(view["ExecMainStatus"]) == errors.SERVER_DIED_AFTER_READY, view
            if steps:
                seen.setdefault(int(view["NRestarts"]) + 1, usec(view["RestartUSecNext"]))
        if view["ActiveState"] == "failed":
            break
        assert time.monotonic() < end, f"no start limit after {WAIT_S} s: {view}\n{inst.journal()}"
        time.sleep(0.05)
    # The first start and burst-1 restarts pass the limit; restart number `burst` is scheduled (the
    # counter shows it) and refused. systemd 257 keeps the crash's result; older ones say start-limit-hit.
    assert int(view["NRestarts"]) == burst, view
    assert view["Result"] in ("exit-code", "start-limit-hit"), view
    journal = inst.journal()
    assert "Start request repeated too quickly." in journal
    assert journal.count("SGLang exited with status 4 while serving") == burst
    if steps:  # RestartUSecNext, as systemd announced it before each restart: the ladder and its cap
        assert set(range(2, burst + 1)) <= set(seen), seen  # every step was observed (1 may be too quick)
        for n, delay in seen.items():
            assert delay == pytest.approx(expected_delay(n, steps), abs=0.01), (n, seen)
    # The waits between a death and the next start were at least those delays.
    mono = inst.journal("-o", "short-monotonic")
    deaths = [float(m) for m in re.findall(r"\[\s*([\d.]+)\].*Main process exited", mono)]
    starts = [float(m) for m in re.findall(r"\[\s*([\d.]+)\].*Starting dflash", mono, re.I)]
    assert len(starts) == burst and len(deaths) == burst, (starts, deaths)
    for n in range(1, burst):
        assert starts[n] - deaths[n - 1] >= expected_delay(n, steps) - 0.05, (n, deaths, starts)


def test_a_hang_is_cut_short_by_stall_detection(deploy):
    # Loading lines for 1 s, then silence but for the health polls (the stand-in's "stall" mode, issue 15).
    inst = deploy("stall", standin={"mode": "stall", "stall_after": 1}, settings={"stallTimeoutSec": 3})
    r = inst.start()
    assert r.returncode != 0
    view = inst.show("ActiveState", "SubState", "Result", "ExecMainStatus", "StatusText", "RestartPreventExitStatus")
    assert int(view["ExecMainStatus"]) == SERVER_STALLED, view
    assert view["Result"] == "exit-code", view
    assert view["StatusText"].startswith(f"failed (exit {SERVER_STALLED})"), view
    prevented = SERVER_STALLED in [int(x) for x in view["RestartPreventExitStatus"].split()]
    assert view["SubState"] == ("failed" if prevented else "auto-restart"), view
    journal = inst.journal()
    assert "no start-up progress for 3 s" in journal, journal
    assert "got signal 15" in inst.read(inst.sglang_log)  # the stalled child was stopped


def test_a_port_another_service_holds_is_named_and_the_start_retried(deploy, container):
    """Another service listens on the instance's port. serve runs under DynamicUser and
    ProtectProc=invisible, so it cannot see that process: it names the socket's user and the `ss`
    command that names the process. Exit 95 before SGLang starts, restarted with backoff (the holder
    may be the last start's SGLang, still stopping); once the port is free the next start serves."""
    inst = deploy("port")
    port = json.loads(inst.read(f"/etc/dflash/{inst.name}.json"))["port"]
    holder = f"port-holder-{inst.name}"
    listen = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(600)"
    container.run(["systemd-run", f"--unit={holder}", "python3", "-c", listen])
    try:
        end = time.monotonic() + WAIT_S
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
        while container.run(["python3", "-c", connect], check=False).returncode != 0:
            assert time.monotonic() < end, container.run(["systemctl", "status", holder], check=False).stdout
            time.sleep(0.1)
        assert inst.start().returncode != 0
        view = inst.wait_for(lambda v: v["SubState"] in ("auto-restart", "failed") and v["ExecMainStatus"] != "0",
                             "failed", props=("ActiveState", "SubState", "ExecMainStatus", "StatusText"))
        assert int(view["ExecMainStatus"]) == errors.PORT_TAKEN, view
        assert view["SubState"] == "auto-restart", view  # restarted, not given up on
        assert view["StatusText"].startswith(
            f"failed (exit {errors.PORT_TAKEN}): 127.0.0.1:{port} is taken: a process of user root listens"), view
        assert f"ss -ltnp 'sport = :{port}'" in view["StatusText"], view
        assert "standin" not in inst.journal()  # SGLang was never started
    finally:
        container.run(["systemctl", "stop", holder], check=False)
    inst.wait_for(lambda v: v["ActiveState"] == "active" and v["SubState"] == "running", "serving once the port is free")


def _role(cmd: str) -> str:
    """What a process of an instance is, from its command line."""
    if "dflashctl serve" in cmd:
        return "serve"
    if "standin_server.py" in cmd:
        return "stand-in"  # the server and the helpers it forked
    if "--multiprocessing-fork" in cmd:
        return "spawned child"  # multiprocessing's spawn: SGLang's scheduler and detokenizer
    if "multiprocessing.resource_tracker" in cmd:
        return "resource tracker"  # started by multiprocessing with the first spawned child
    if "dflash_faststart" in cmd:
        return "template"  # the fast start's, and the children forked from it (its command line)
    return cmd


@pytest.mark.parametrize("fast", [False, True], ids=["spawn", "faststart"])
def test_stop_leaves_no_process_behind(deploy, fast):
    """Two helpers that ignore SIGTERM in SGLang's process group, beside the scheduler and the
    detokenizer (spawned, or forked from the fast start's template): dflashctl must still end them."""
    inst = deploy("stopf" if fast else "stop", standin={"children": 2}, settings={"fastStart": fast})
    assert inst.start().returncode == 0
    before = inst.processes()
    main = int(inst.show("MainPID")["MainPID"])
    roles = sorted(_role(p["cmd"]) for p in before)
    if fast:  # forked from the template, scheduler and detokenizer keep its command line: no setproctitle here
        assert roles == ["resource tracker", "serve"] + ["stand-in"] * 3 + ["template"] * 3, before
    else:
        assert roles == ["resource tracker", "serve"] + ["spawned child"] * 2 + ["stand-in"] * 3, before
    assert any(p["pid"] == main and "dflashctl serve" in p["cmd"] for p in before), before
    r = inst.systemctl("stop", inst.unit)
    assert r.returncode == 0, r.stderr
    view = inst.show("ActiveState", "Result", "ExecMainStatus", "MainPID")
    assert view == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "MainPID": "0"}, view
    assert inst.processes() == []
    left = {pid: cmd for pid, cmd in all_processes(inst.c).items()
            if pid in {p["pid"] for p in before} or "standin_server" in cmd or "dflash_faststart" in cmd}
    assert left == {}, left
    journal = inst.journal()
    assert "SGLang stopped with status 0" in journal
    # dflashctl ended the whole group itself: systemd's KillMode=mixed SIGKILL found nothing left.
    assert "Killing process" not in journal, journal


def test_api_key_through_load_credential_under_dynamic_user(deploy, container):
    key = "sk-" + os.urandom(12).hex()
    container.write("/etc/dflash/keys/cred.key", key + "\n", mode=0o600)
    inst = deploy("cred", settings={"apiKeyFile": "/etc/dflash/keys/cred.key"})
    assert inst.start().returncode == 0, inst.journal()
    view = inst.show("DynamicUser", "ExecStart", "UID")
    assert view["DynamicUser"] == "yes", view
    unit_files = inst.c.run(["systemctl", "cat", inst.unit]).stdout
    assert "\nLoadCredential=api-key:/etc/dflash/keys/cred.key\n" in unit_files
    # The service read it: the stand-in was asked for /health_generate with the key...
    assert f"auth=Bearer {key}" in inst.read(f"{inst.home}/ok")
    # ...which its dynamic user could not have read from the file itself (root's, mode 0600).
    assert int(view["UID"]) != 0
    st = container.path("/etc/dflash/keys/cred.key").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    main = int(inst.show("MainPID")["MainPID"])
    cmdline = inst.read(f"/proc/{main}/cmdline").replace("\0", " ")
    assert "dflashctl serve" in cmdline and key not in cmdline
    for where, text in (("unit", unit_files), ("ExecStart", view["ExecStart"]), ("journal", inst.journal())):
        assert key not in text, where


@pytest.mark.parametrize("explicit", [False, True], ids=["CacheDirectory", "cacheDir"])
def test_cache_directory_is_home_and_persists_across_restarts(deploy, container, unit_source, explicit):
    scenario = "cache-d" if explicit else "cache"
    # Under DynamicUser only a directory below /var/cache can belong to the service.
    cache_dir = f"/var/cache/hf-{instance_name(scenario, unit_source)}" if explicit else None
    inst = deploy(scenario, standin={"mark": 1}, settings={"cacheDir": cache_dir} if explicit else {})
    if explicit and not re.search(rf"^CacheDirectory=.*\b{Path(cache_dir).name}\b", inst.text, re.M):
        container.run(["install", "-d", "-m", "1777", cache_dir])  # the unit does not create it: the admin does
    for _ in range(3):
        r = inst.systemctl("restart", inst.unit, timeout=WAIT_S + 30)
        assert r.returncode == 0, inst.journal()
    view = inst.show("Environment", "CacheDirectory", "WorkingDirectory", "UID", "NRestarts")
    assert f"HOME={inst.home}" in view["Environment"].split(), view
    assert inst.unit.removesuffix(".service") in view["CacheDirectory"].split(), view
    uid = int(view["UID"])
    home = inst.read(f"{inst.home}/standin-starts").splitlines()
    assert len(home) == 3, home  # one line per start, none lost between them
    assert {line.split()[1] for line in home} == {str(uid)}
    hf_home = json.loads(inst.read(f"{inst.home}/argv.json"))["env"]["HF_HOME"]
    assert hf_home == (cache_dir or inst.home)  # cacheDir when set, else the cache directory
    hf = inst.read(f"{hf_home}/standin-starts").splitlines()
    assert len(hf) == 3, hf
    # Every JIT cache (tvm-ffi, flashinfer, CuTe-DSL, Triton, CUDA, inductor) is named for the child,
    # in the unit's own cache directory (not the model cache, not the private /tmp), and keeps what
    # each start wrote.
    env = json.loads(inst.read(f"{inst.home}/argv.json"))["env"]
    jit = {v: env.get(v) for v in ("TVM_FFI_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUTE_DSL_CACHE_DIR",
                                   "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR")}
    assert all(d and d.startswith(f"{inst.home}/jit/") for d in jit.values()), jit
    for d in jit.values():
        assert len(inst.read(f"{d}/standin-starts").splitlines()) == 3, d


def test_jit_toolchain_under_the_sandbox(deploy):
    """The service's child compiles a shared library and a program that dlopens it, as SGLang's
    first start does (tvm-ffi, flashinfer): the unit's PATH, PrivateTmp, HOME and the syscall filter."""
    inst = deploy("jit", standin={"jit": 1})
    r = inst.start()
    journal = inst.journal()
    assert r.returncode == 0, journal
    assert inst.show("ActiveState")["ActiveState"] == "active"
    assert f"standin: jit ok: answer=42 (built in {inst.home}/jit)" in journal, journal
    listing = inst.c.run(["ls", f"{inst.home}/jit"]).stdout.split()
    assert {"libanswer.so", "main"} <= set(listing), listing


# --- the router in front of two instances ------------------------------------------------------------

ROUTER_VENV = "/opt/dflash-router"
ROUTER_CLIENT = r"""
import json, sys, urllib.request, urllib.error
url, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}).encode()
out = []
for _ in range(n):
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out.append([r.status, json.loads(r.read())["meta_info"]["id"].split("-")[1]])
    except urllib.error.HTTPError as e:
        out.append([e.code, None])
    except OSError as e:
        out.append([0, str(e)])
print(json.dumps(out))
"""


def router_wheels(c: Container) -> Path:
    """The router environment's wheels for the container's Python, at the versions of
    nix/router-lock.json, downloaded once from the package index into the tier's cache (the
    container has no network). The router's own wheel (abi3) is the lock's file: sha256 checked."""
    import hashlib
    import subprocess
    import sys
    from systemd_container import cache_dir
    py = c.run(["python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"]).stdout.strip()
    lock = json.loads((REPO / "nix" / "router-lock.json").read_text())["systems"]["x86_64-linux"]["packages"]
    out = cache_dir() / "router-wheels" / f"cp{py.replace('.', '')}-{hashlib.sha256(json.dumps(lock, sort_keys=True).encode()).hexdigest()[:12]}"
    if not (out / "complete").exists():
        out.mkdir(parents=True, exist_ok=True)
        platforms = [f"--platform={p}_x86_64" for p in ("manylinux_2_34", "manylinux_2_28", "manylinux_2_17",
                                                        "manylinux2014", "manylinux_2_5", "manylinux1")]
        abi = f"cp{py.replace('.', '')}"
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                            f"--python-version={py}", "--implementation=cp", f"--abi={abi}", "--abi=abi3",
                            "--abi=none", *platforms, "--platform=any", "-d", str(out),
                            *(f"{n}=={p['version']}" for n, p in sorted(lock.items()))],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            why = f"the router's wheels for Python {py} could not be downloaded: {r.stderr[-300:]}"
            if os.environ.get("DFLASH_REQUIRE_SYSTEMD") == "1":  # tests/run as root: the tier must run whole
                pytest.fail(f"tests/run requires the systemd tier here, but {why}")
            pytest.skip(why)
        (out / "complete").write_text("")
    router = lock["sglang-router"]
    got = hashlib.sha256((out / router["file"]).read_bytes()).hexdigest()
    assert got == router["sha256"], f"{router['file']}: sha256 {got}, the lock says {router['sha256']}"
    return out


def install_router(c: Container) -> None:
    """sglang-router 0.3.2 in its own venv in the container (once per container)."""
    if c.run(["test", "-x", f"{ROUTER_VENV}/bin/python"], check=False).returncode == 0:
        return
    wheels = router_wheels(c)
    c.copy_tree(wheels, "/opt/router-wheels")
    c.run(["python3", "-m", "venv", ROUTER_VENV])
    c.run([f"{ROUTER_VENV}/bin/pip", "install", "-q", "--no-index", "--find-links", "/opt/router-wheels",
           "sglang-router"], timeout=180)


def render_router(c: Container, instances: list, unit_path: str = "/etc/systemd/system/dflash-router.service",
                  settings_path: str = "/etc/dflash-router.json") -> str:
    """`dflashctl router-unit` for `instances`, as a host without NixOS runs it; returns the unit text."""
    args = [a for inst in instances for a in ("--instance", f"/etc/dflash/{inst.name}.json")]
    c.run([DFLASHCTL, "router-unit", *args, "--python", f"{ROUTER_VENV}/bin/python", "--dflashctl", DFLASHCTL,
           "-o", unit_path, "--settings-output", settings_path])
    return c.run(["cat", unit_path]).stdout


def remove_router(c: Container, unit: Instance) -> tuple:
    stopped = unit.systemctl("stop", unit.unit)
    view = unit.show("ActiveState", "Result")
    journal = unit.journal()
    c.run(["rm", "-f", "/etc/systemd/system/dflash-router.service"])
    c.run(["systemctl", "daemon-reload"])
    return stopped, view, journal


@pytest.mark.parametrize("unit_source", ["dflashctl_unit"], indirect=True)
def test_router_in_front_of_two_instances(deploy, container):
    """dflash-router.service from `dflashctl router-unit`, with sglang-router 0.3.2 in its own venv:
    it starts after the instances, serves through a stop, a start and a restart of one of them,
    re-admits it, and stops cleanly within its stop timeout. No GPU: DevicePolicy=closed, no
    DeviceAllow (not enforced in the container, checked as systemd parsed it)."""
    c = container
    install_router(c)
    a, b = deploy("ra"), deploy("rb")
    for inst in (a, b):
        assert inst.start().returncode == 0, inst.journal()
    unit = Instance(c, "router")  # dflash-router.service: the same systemctl/journal helpers
    render_router(c, [a, b])
    c.write(f"{TEST_DIR}/client.py", ROUTER_CLIENT)
    c.run(["systemctl", "daemon-reload"])
    try:
        r = unit.start()
        assert r.returncode == 0, unit.journal()
        settings = json.loads(c.run(["cat", "/etc/dflash-router.json"]).stdout)
        url = f"http://127.0.0.1:{settings['port']}"
        ports = {a.name: str(json.loads(a.read(f"/etc/dflash/{a.name}.json"))["port"]),
                 b.name: str(json.loads(b.read(f"/etc/dflash/{b.name}.json"))["port"])}

        def send(n: int) -> list:
            return json.loads(c.run(["python3", f"{TEST_DIR}/client.py", url, str(n)], timeout=WAIT_S + 60).stdout)

        def wait_served_by(port: str) -> None:
            end = time.monotonic() + WAIT_S
            while time.monotonic() < end:
                if any(s == 200 and p == port for s, p in send(4)):
                    return
                time.sleep(0.5)
            pytest.fail(f"the router never sent a request to port {port}\n{unit.journal()}")

        wait_served_by(ports[a.name])
        wait_served_by(ports[b.name])
        view = unit.show("DevicePolicy", "DeviceAllow", "PrivateDevices", "TimeoutStopUSec", "After", "Wants",
                         "Requires", "ActiveState")
        assert view["DevicePolicy"] == "closed" and view["PrivateDevices"] == "yes", view
        assert "nvidia" not in view["DeviceAllow"], view  # only what ProtectClock adds (char-rtc r)
        # ordered after the instances by their own Before= (systemd shows it from both sides); it
        # neither wants nor requires them: up while they are down, its unit names none of them
        assert {a.unit, b.unit} <= set(view["After"].split()), view
        assert not {a.unit, b.unit} & (set(view["Requires"].split()) | set(view["Wants"].split())), view
        assert usec(view["TimeoutStopUSec"]) > settings["drainSec"]
        # one instance stopped: the router stays active and every request is answered by the other
        assert a.systemctl("stop", a.unit).returncode == 0
        assert unit.show("ActiveState")["ActiveState"] == "active"
        time.sleep(settings["healthCheckIntervalSec"] * (settings["healthFailureThreshold"] + 1))
        answers = send(20)
        assert all(s == 200 for s, _ in answers), answers
        assert {p for _, p in answers} == {ports[b.name]}
        # started again: re-admitted on the same URL
        assert a.start().returncode == 0, a.journal()
        wait_served_by(ports[a.name])
        # a restart of the other: the router serves throughout, then has both again
        assert b.systemctl("restart", b.unit, timeout=WAIT_S + 30).returncode == 0
        assert all(s == 200 for s, _ in send(20))
        wait_served_by(ports[b.name])
        assert unit.show("ActiveState", "NRestarts") == {"ActiveState": "active", "NRestarts": "0"}
    finally:
        stopped, view, journal = remove_router(c, unit)
    assert stopped.returncode == 0 and view == {"ActiveState": "inactive", "Result": "success"}, (view, journal)


ROUTER_LOAD = r"""
import json, os, sys, threading, time, urllib.request, urllib.error
url, out, stop, clients = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}).encode()
lock, f = threading.Lock(), open(out, "a", buffering=1)
def client():
    deadline = time.monotonic() + 600
    while not os.path.exists(stop) and time.monotonic() < deadline:
        start = time.monotonic()
        req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                rec = [time.time(), r.status, json.loads(r.read())["meta_info"]["id"].split("-")[1]]
        except urllib.error.HTTPError as e:
            rec = [time.time(), e.code, e.read()[:200].decode(errors="replace")]
        except OSError as e:
            rec = [time.time(), 0, str(e)]
        with lock:
            f.write(json.dumps(rec) + "\n")
threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
open(out + ".done", "w").close()
"""


@pytest.mark.parametrize("unit_source", ["dflashctl_unit"], indirect=True)
def test_router_reload_adds_and_removes_a_worker_under_load(deploy, container):
    """Instances come and go as `nixos-rebuild switch` (switch-to-configuration) handles it: the
    router's unit is unchanged (it names no instance), its settings file gets the new workers,
    `systemctl reload dflash-router` runs, and only then is the new instance started (reloads come
    before starts there); a removed instance is stopped first, then the router reloaded. Under
    closed-loop load throughout: no request fails, the new instance serves, and the router is never
    restarted (same MainPID, NRestarts 0)."""
    import nixos_switch
    c = container
    install_router(c)
    a, b = deploy("la", standin={"token_delay": "0.01"}), deploy("lb", standin={"token_delay": "0.01"})
    assert a.start().returncode == 0, a.journal()
    unit = Instance(c, "router")
    before = render_router(c, [a])
    c.run(["systemctl", "daemon-reload"])
    out, stop = f"{TEST_DIR}/load.jsonl", f"{TEST_DIR}/load.stop"
    c.run(["rm", "-f", out, out + ".done", stop])
    c.write(f"{TEST_DIR}/load.py", ROUTER_LOAD)
    c.write(f"{TEST_DIR}/client.py", ROUTER_CLIENT)
    try:
        assert unit.start().returncode == 0, unit.journal()
        settings = json.loads(c.run(["cat", "/etc/dflash-router.json"]).stdout)
        url = f"http://127.0.0.1:{settings['port']}"
        port = {i.name: str(json.loads(i.read(f"/etc/dflash/{i.name}.json"))["port"]) for i in (a, b)}
        pid = unit.show("MainPID")["MainPID"]

        def served() -> list:
            records = []
            for line in c.run(["cat", out], check=False).stdout.splitlines():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass  # the line being written
            return records

        def wait_until(what: str, predicate, timeout: float = WAIT_S):
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                records = served()
                if predicate(records):
                    return records
                time.sleep(0.5)
            pytest.fail(f"load: not {what} after {timeout} s; {len(served())} answers\n{unit.journal()}")

        # before the load starts, the router must have admitted a (else its first answers are 503s)
        for _ in range(WAIT_S * 2):
            if c.run(["python3", f"{TEST_DIR}/client.py", url, "1"], check=False).stdout.count("200"):
                break
            time.sleep(0.5)
        c.run(["systemd-run", "--unit=dflash-test-load", "python3", f"{TEST_DIR}/load.py", url, out, stop, "4"])
        wait_until("50 answers", lambda r: len(r) >= 50)

        # an instance added: the same unit, new settings, reload, then the new instance starts
        after = render_router(c, [a, b], unit_path=f"{TEST_DIR}/dflash-router.service")
        assert nixos_switch.action(nixos_switch.parse(before), nixos_switch.parse(after)) == "nothing"
        render_router(c, [a, b])
        c.run(["systemctl", "daemon-reload"])
        assert unit.systemctl("reload", unit.unit).returncode == 0, unit.journal()
        assert b.start().returncode == 0, b.journal()
        added = time.time()
        wait_until(f"served by {b.name}", lambda r: sum(x[2] == port[b.name] for x in r if x[0] > added) >= 20)

        # an instance removed: stopped first, then the settings without it and a reload
        assert a.systemctl("stop", a.unit).returncode == 0
        render_router(c, [b])
        c.run(["systemctl", "daemon-reload"])
        assert unit.systemctl("reload", unit.unit).returncode == 0, unit.journal()
        removed = time.time()
        wait_until("50 answers after the removal", lambda r: sum(x[0] > removed for x in r) >= 50)
        c.run(["touch", stop])
        for _ in range(WAIT_S * 2):
            if c.run(["test", "-e", out + ".done"], check=False).returncode == 0:
                break
            time.sleep(0.5)
        records = served()
        failed = [x for x in records if x[1] != 200]
        assert not failed, f"{len(failed)} of {len(records)} requests failed, first {failed[:3]}"
        assert {x[2] for x in records if x[0] > removed} == {port[b.name]}  # a was stopped before it
        assert unit.show("MainPID", "NRestarts") == {"MainPID": pid, "NRestarts": "0"}
        journal = unit.journal()
        assert f"added http://127.0.0.1:{port[b.name]}" in journal, journal
        assert f"removed http://127.0.0.1:{port[a.name]}" in journal, journal
        print(f"router reload under load: {len(records)} requests, 0 failed, "
              f"{sum(x[2] == port[b.name] for x in records)} by the added instance")
    finally:
        c.run(["touch", stop], check=False)
        c.run(["systemctl", "stop", "dflash-test-load"], check=False)
        c.run(["systemctl", "reset-failed", "dflash-test-load"], check=False)
        stopped, view, journal = remove_router(c, unit)
    assert stopped.returncode == 0 and view == {"ActiveState": "inactive", "Result": "success"}, (view, journal)


# --- a rollout over real units ------------------------------------------------------------------------

def new_version(c: Container, inst: "Instance", marker: str, preflight: bool = False) -> None:
    """A changed setting, its unit rendered again by `dflashctl unit`, `systemctl daemon-reload`:
    what a non-NixOS host does to upgrade (the unit's DFLASH_UNIT_DIGEST changes with it)."""
    path = f"/etc/dflash/{inst.name}.json"
    cfg = json.loads(inst.read(path))
    cfg["environment"]["STANDIN_VERSION"] = marker
    c.write(path, json.dumps(cfg, indent=2))
    c.write(f"/etc/systemd/system/{inst.unit}", dflashctl_unit_text(c, inst.name, cfg))
    if preflight:  # the test drop-in's --skip-preflight goes: the real preflight runs, and fails here
        c.write(f"/etc/systemd/system/{inst.unit}.d/test.conf",
                f"[Service]\nEnvironment={shlex.quote('DFLASHCTL_SGLANG_LAUNCHER=' + LAUNCHER)}\n")
    c.run(["systemctl", "daemon-reload"])


def running_digest(inst: "Instance") -> tuple[str, str]:
    """(the digest the running main process carries, the digest of the unit as systemd has it)."""
    pid = inst.show("MainPID")["MainPID"]
    env = inst.c.run(["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
    running = next(e.split("=", 1)[1] for e in env if e.startswith("DFLASH_UNIT_DIGEST="))
    configured = re.search(r"DFLASH_UNIT_DIGEST=([0-9a-f]+)", inst.show("Environment")["Environment"]).group(1)
    return running, configured


@pytest.mark.parametrize("unit_source", ["dflashctl_unit"], indirect=True)
def test_rollout_over_real_units(deploy, container):
    """A host upgraded as README says for non-NixOS hosts: settings changed, units rendered again,
    daemon-reload, `dflashctl rollout`. Under load through the router: every request answered, each
    unit restarted once (a new InvocationID) into its new definition, the router never restarted;
    run again, nothing to do; a version whose preflight fails stops at the first unit with
    systemd's own status, and the other unit is not touched."""
    c = container
    install_router(c)
    a, b = deploy("rolla"), deploy("rollb")
    for inst in (a, b):
        assert inst.start().returncode == 0, inst.journal()
    router = Instance(c, "router")
    render_router(c, [a, b])
    c.write(f"{TEST_DIR}/client.py", ROUTER_CLIENT)
    c.write(f"{TEST_DIR}/load.py", ROUTER_LOAD)
    c.run(["systemctl", "daemon-reload"])
    out, stop = f"{TEST_DIR}/rollout-load.jsonl", f"{TEST_DIR}/rollout-load.stop"
    c.run(["rm", "-f", out, out + ".done", stop])
    rollout = [DFLASHCTL, "rollout", "--instance", f"/etc/dflash/{a.name}.json", "--instance",
               f"/etc/dflash/{b.name}.json", "--healthy-for", "1", "--json", *QUICK_CANARY]
    try:
        assert router.start().returncode == 0, router.journal()
        url = f"http://127.0.0.1:{json.loads(c.run(['cat', '/etc/dflash-router.json']).stdout)['port']}"
        for inst in (a, b):
            assert running_digest(inst)[0] == running_digest(inst)[1]
        nothing = c.run(rollout, check=False, timeout=WAIT_S)
        assert nothing.returncode == 0 and json.loads(nothing.stdout)["instances"] == [], nothing.stderr
        before = {i.name: i.show("InvocationID")["InvocationID"] for i in (a, b)}
        for inst in (a, b):
            new_version(c, inst, "2")
            assert running_digest(inst)[0] != running_digest(inst)[1]  # systemd knows; the process predates it
        for _ in range(WAIT_S * 2):  # the router admits both before the load starts
            if c.run(["python3", f"{TEST_DIR}/client.py", url, "2"], check=False).stdout.count("200") == 2:
                break
            time.sleep(0.5)
        c.run(["systemd-run", "--unit=dflash-test-load", "--collect", "python3", f"{TEST_DIR}/load.py", url,
               out, stop, "4"])
        time.sleep(2)
        done = c.run(rollout, check=False, timeout=WAIT_S * 3)
        assert done.returncode == 0, done.stderr + a.journal()
        result = json.loads(done.stdout)
        assert [(s["name"], s["outcome"], s["canary"]["verdict"]) for s in result["instances"]] == \
            [(a.name, "done", "passed"), (b.name, "done", "passed")], result
        for inst in (a, b):
            assert inst.show("InvocationID")["InvocationID"] != before[inst.name]
            assert running_digest(inst)[0] == running_digest(inst)[1]
        c.run(["touch", stop])
        end = time.monotonic() + WAIT_S
        while c.run(["test", "-e", out + ".done"], check=False).returncode != 0 and time.monotonic() < end:
            time.sleep(0.5)
        records = [json.loads(line) for line in c.run(["cat", out]).stdout.splitlines()]
        failed = [x for x in records if x[1] != 200]
        assert records and not failed, f"{len(failed)} of {len(records)} failed, first {failed[:3]}"
        assert router.show("NRestarts")["NRestarts"] == "0"
        again = c.run(rollout, check=False, timeout=WAIT_S)
        assert again.returncode == 0 and json.loads(again.stdout)["instances"] == [], again.stderr
        assert {u["name"] for u in json.loads(again.stdout)["up_to_date"]} == {a.name, b.name}

        # A build the canary stops (its greedy outputs change although nothing in the definition says
        # they may), then the revert as `dflashctl upgrade` does it: the previous settings and unit
        # back, daemon-reload, `rollout --resume`: the first unit restarted on its old definition,
        # judged against the reading from before, back in rotation; the second never touched.
        invocation_b = b.show("InvocationID")["InvocationID"]
        previous = {path: c.run(["cat", path]).stdout for path in (f"/etc/dflash/{a.name}.json",
                                                                   f"/etc/systemd/system/{a.unit}")}
        cfg = json.loads(previous[f"/etc/dflash/{a.name}.json"])
        cfg["environment"]["STANDIN_DIVERGE_FROM"] = "0"
        c.write(f"/etc/dflash/{a.name}.json", json.dumps(cfg, indent=2))
        c.write(f"/etc/systemd/system/{a.unit}", dflashctl_unit_text(c, a.name, cfg))
        c.run(["systemctl", "daemon-reload"])
        stopped = c.run(rollout, check=False, timeout=WAIT_S * 2)
        assert stopped.returncode == errors.ROLLOUT_STOPPED, stopped.stderr
        first = json.loads(stopped.stdout)["instances"][0]
        assert (first["name"], first["outcome"], first["step"]) == (a.name, "failed", "measure after"), first
        assert "outputs" in first["error"] and first["canary"]["verdict"] == "failed", first
        for path, text in previous.items():
            c.write(path, text)
        c.run(["systemctl", "daemon-reload"])
        reverted = c.run(rollout + ["--resume"], check=False, timeout=WAIT_S * 2)
        assert reverted.returncode == 0, reverted.stderr
        assert [(s["name"], s["outcome"], s["canary"]["verdict"]) for s in json.loads(reverted.stdout)["instances"]] \
            == [(a.name, "done", "passed")], reverted.stdout
        assert running_digest(a)[0] == running_digest(a)[1]  # on the old definition again
        assert b.show("InvocationID")["InvocationID"] == invocation_b
        assert [s for s, _ in json.loads(c.run(["python3", f"{TEST_DIR}/client.py", url, "10"]).stdout)] == [200] * 10

        invocation_b = b.show("InvocationID")["InvocationID"]
        for inst in (a, b):
            new_version(c, inst, "3", preflight=True)
        failed = c.run(rollout, check=False, timeout=WAIT_S * 2)
        assert failed.returncode == errors.ROLLOUT_STOPPED, failed.stderr
        first, second = json.loads(failed.stdout)["instances"]
        assert first["outcome"] == "failed" and "failed (exit 85): preflight" in first["error"], first
        assert second["outcome"] == "not reached"
        assert b.show("InvocationID")["InvocationID"] == invocation_b  # untouched, still serving
        assert all(s == 200 for s, _ in json.loads(c.run(["python3", f"{TEST_DIR}/client.py", url, "10"]).stdout))
    finally:
        c.run(["touch", stop], check=False)
        c.run(["systemctl", "stop", "dflash-test-load"], check=False)
        stopped, view, journal = remove_router(c, router)
        # the container is shared by the tests after this one: `dflashctl status` there would read
        # this test's last (failed, on purpose) rollout from the default state directory
        c.run(["rm", "-rf", "/var/lib/dflash-rollout"], check=False)
    assert stopped.returncode == 0, journal


@pytest.mark.parametrize("unit_source", ["dflashctl_unit"], indirect=True)
def test_status_reads_the_units_restarts_and_journal(deploy, container):
    """`dflashctl status` under a real systemd (docs/monitoring.md): one instance serving, one whose
    SGLang dies before it is ready and is restarted with backoff. Its row shows systemd's view
    (state, since when, NRestarts, the exit status and StatusText serve left) and the newest error
    line the service wrote to its journal; the serving one is healthy; exit 1."""
    c = container
    a = deploy("stata")
    b = deploy("statb", standin={"mode": "crash", "ready_after": 0.3})
    assert a.start().returncode == 0, a.journal()
    b.start()  # fails: the stand-in exits 3 before it is ready (exit 90, restarted)
    b.wait_for(lambda v: int(v["NRestarts"] or 0) >= 1, "restarted once", props=("NRestarts",))
    c.run(["journalctl", "--sync"], check=False)
    done = c.run([DFLASHCTL, "status", "--json", "--no-router", "--window", "1", "--instance",
                  f"/etc/dflash/{a.name}.json", "--instance", f"/etc/dflash/{b.name}.json"], check=False)
    assert done.returncode == 1, done.stderr
    rep = json.loads(done.stdout)
    assert rep["systemd"] is True and rep["router"] is None
    rows = {r["name"]: r for r in rep["instances"]}
    ua, ub = rows[a.name]["unit_state"], rows[b.name]["unit_state"]
    assert (ua["active"], ua["sub"], ua["restarts"]) == ("active", "running", 0) and rows[a.name]["healthy"]
    import calendar
    age = time.time() - calendar.timegm(time.strptime(ua["since"], "%Y-%m-%dT%H:%M:%SZ"))
    assert -2 <= age < WAIT_S * 3, ua  # since it became active: moments ago (the clocks are one)
    assert rows[a.name]["metrics"] == "on" and rows[a.name]["requests_running"] == 0  # serve passes --enable-metrics
    assert ub["restarts"] >= 1 and not rows[b.name]["healthy"]
    assert (ub["active"], ub["sub"]) != ("active", "running")
    assert any(p.startswith("unit ") for p in rows[b.name]["problems"]), rows[b.name]
    assert "StructuralTag" in rows[b.name]["last_error"]["text"], rows[b.name]["last_error"]
    assert rows[a.name]["last_error"] is None
    text = c.run([DFLASHCTL, "status", "--no-router", "--window", "0", "--instance", f"/etc/dflash/{a.name}.json"],
                 check=False)
    assert text.returncode == 0 and text.stdout.splitlines()[1].split()[1] == "active/running", text.stdout


# --- the unit as the README renders it on a host without NixOS (issue 34) ----------------------------


def _install_steps(stderr: str) -> str:
    """The steps `dflashctl unit` prints for root, as a shell script (the log-following last line out)."""
    lines = stderr.split("Install on the host (as root):\n", 1)[1].splitlines()
    return "\n".join(ln for ln in lines if "journalctl -u" not in ln) + "\n"


def _readme_unit(c: Container, name: str, dflashctl: str, extra: tuple[str, ...] = (), settings=None):
    """`cd DIR && dflashctl unit --config NAME.json -o dflash-NAME.service` as README's "A host without
    NixOS" says: a relative settings file, no --dflashctl (the one that runs), the default
    --config-path. Returns (settings, the command's result, the unit's text or None)."""
    inst = Instance(c, name)
    cfg = {"name": name, "model": "stand-in", "port": next(_ports), "gpus": [0], "startTimeoutSec": 120,
           "environment": {"STANDIN_OK_FILE": f"{inst.home}/ok", "STANDIN_ARGV_FILE": f"{inst.home}/argv.json"},
           **(settings or {})}
    c.write(f"/root/render/{name}.json", json.dumps(cfg, indent=2))
    script = (f"cd /root/render && {shlex.quote(dflashctl)} unit --config {name}.json "
              f"-o {inst.unit} {' '.join(map(shlex.quote, extra))}")
    r = c.run(["sh", "-c", script], check=False)
    text = c.run(["cat", f"/root/render/{inst.unit}"], check=False).stdout if r.returncode == 0 else None
    return inst, r, text


def _follow_the_steps(c: Container, inst: Instance, r, text: str) -> None:
    """The drop-in that swaps SGLang for the stand-in, then the printed steps, run by sh as root."""
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    c.write(f"/etc/systemd/system/{inst.unit}.d/test.conf",
            f"[Service]\nEnvironment={shlex.quote('DFLASHCTL_SGLANG_LAUNCHER=' + LAUNCHER)}\n"
            f"ExecStart=\n{exec_start} --skip-preflight\n")
    steps = c.run(["sh", "-ec", "cd /root/render\n" + _install_steps(r.stderr)], check=False, timeout=WAIT_S + 60)
    assert steps.returncode == 0, steps.stdout + steps.stderr + inst.journal()


def _forget(c: Container, inst: Instance, settings_path: str) -> None:
    inst.systemctl("disable", "--now", inst.unit)
    inst.systemctl("reset-failed", inst.unit)
    c.run(["rm", "-rf", f"/etc/systemd/system/{inst.unit}", f"/etc/systemd/system/{inst.unit}.d", settings_path])
    c.run(["systemctl", "daemon-reload"])


def test_a_unit_rendered_as_the_readme_says_starts(container):
    """A venv under /opt (README), `dflashctl unit` with no --dflashctl, the printed steps run as
    printed, with a settings path that needs quoting (`--config-path '/etc/dflash/my gpu0.json'`,
    finding 9): the unit starts and is ready."""
    c = container
    inst, r, text = _readme_unit(c, "readme", DFLASHCTL, ("--config-path", "/etc/dflash/my readme.json"))
    assert r.returncode == 0, r.stderr
    assert "'/etc/dflash/my readme.json'" in r.stderr  # quoted for the shell it is pasted into
    assert f"ExecStart={DFLASHCTL} serve --config \"/etc/dflash/my readme.json\"" in text
    try:
        _follow_the_steps(c, inst, r, text)
        view = inst.show("ActiveState", "SubState", "StatusText")
        assert (view["ActiveState"], view["SubState"]) == ("active", "running"), (view, inst.journal())
        assert inst.read(f"{inst.home}/ok").startswith("200 ")
        assert json.loads(inst.read("/etc/dflash/my readme.json"))["name"] == "readme"
    finally:
        _forget(c, inst, "/etc/dflash/my readme.json")


def test_a_unit_rendered_from_a_nix_profile_names_the_store(container):
    """`nix profile install .#dflash-env` puts dflashctl behind ~/.nix-profile, under /root, which
    ProtectHome hides: the unit names the store path the profile links to, and it starts. The
    store here is a stand-in: a venv at a /nix/store path, linked the way a profile links."""
    c = container
    env = "/nix/store/0000000000000000000000000000000a-dflash-env"
    profile = "/nix/store/0000000000000000000000000000000b-profile"
    c.run(["python3", "-m", "venv", "--system-site-packages", env])
    c.run([f"{env}/bin/pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
           "/opt/dflash-src"], timeout=180)
    c.run(["sh", "-ec", f"mkdir -p {profile}/bin /nix/var/nix/profiles && ln -sfn {env}/bin/dflashctl "
                        f"{profile}/bin/dflashctl && ln -sfn {profile} /nix/var/nix/profiles/default && "
                        "ln -sfn /nix/var/nix/profiles/default /root/.nix-profile"])
    inst, r, text = _readme_unit(c, "profile", "/root/.nix-profile/bin/dflashctl")
    assert r.returncode == 0, r.stderr
    assert f"ExecStart={profile}/bin/dflashctl serve --config /etc/dflash/profile.json" in text
    try:
        _follow_the_steps(c, inst, r, text)
        assert inst.show("ActiveState")["ActiveState"] == "active", inst.journal()
    finally:
        _forget(c, inst, "/etc/dflash/profile.json")


def test_a_venv_under_root_is_refused_with_the_fix(container):
    """Finding 1: from a venv in /root the unit would fail with 203/EXEC under ProtectHome; `unit`
    refuses to render it, and says where to put the stack instead."""
    c = container
    c.run(["python3", "-m", "venv", "--system-site-packages", "/root/venv"])
    c.run(["/root/venv/bin/pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
           "/opt/dflash-src"], timeout=180)
    inst, r, text = _readme_unit(c, "rootvenv", "/root/venv/bin/dflashctl")
    assert r.returncode == errors.CONFIG and text is None, r.stderr
    assert "/root/venv/bin/dflashctl is hidden from the service by ProtectHome=true" in r.stderr
    assert r.stderr.splitlines()[-1].startswith("  fix: install the stack outside /home, /root and /tmp")
    assert not c.path(f"/root/render/{inst.unit}").exists()  # nothing written


def test_a_missing_credential_file_is_named_when_the_unit_fails(deploy, container, unit_source):
    """An apiKeyFile that does not exist: `unit` warns when it renders; at start systemd hands the
    service the unit's SetCredential fallback, and serve names the file in the status and the
    journal and exits 78, not restarted (without the fallback systemd fails the unit with
    243/CREDENTIALS, "Failed to set up credentials: Protocol error", naming nothing)."""
    key = "/etc/dflash/keys/never-made.key"
    if unit_source == "dflashctl_unit":
        warned = container.run([DFLASHCTL, "unit", "--config", "/dev/stdin", "--dflashctl", DFLASHCTL],
                               input=json.dumps({"name": "w", "model": "m", "apiKeyFile": key}))
        assert f"warning: apiKeyFile {key} does not exist on this host" in warned.stderr
    inst = deploy("nokey", settings={"apiKeyFile": key})
    r = inst.start()
    assert r.returncode != 0
    view = inst.show("ActiveState", "Result", "ExecMainStatus", "NRestarts", "StatusText")
    assert int(view["ExecMainStatus"]) == errors.CONFIG and view["ActiveState"] == "failed", view
    assert f"systemd could not read apiKeyFile {key}" in view["StatusText"], view
    status = inst.systemctl("status", "--no-pager", "-l", "--lines", "20", inst.unit).stdout
    print(f"\nsystemctl status ({unit_source}):\n{status}")
    assert f"systemd could not read apiKeyFile {key}" in status, status  # what the operator sees
    assert "fix: create " + key in inst.journal()
    time.sleep(usec(inst.show("RestartUSec")["RestartUSec"]) + 1)
    assert inst.show("NRestarts")["NRestarts"] == "0"
    if unit_source == "dflashctl_unit":  # and what systemd alone says, without the fallback
        inst.systemctl("reset-failed", inst.unit)
        container.write(f"/etc/systemd/system/{inst.unit}.d/zz-no-fallback.conf", "[Service]\nSetCredential=\n")
        container.run(["systemctl", "daemon-reload"])
        assert inst.start().returncode != 0
        view = inst.show("ExecMainStatus", "StatusText")
        assert int(view["ExecMainStatus"]) == 243, view  # 243/CREDENTIALS
        journal = inst.journal()
        assert "Failed to set up credentials" in journal and key not in journal.split("Failed to set up", 1)[1]
