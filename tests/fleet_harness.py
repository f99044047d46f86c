"""Three GPU hosts on one machine for the fleet tests: network namespaces on a bridge, sshd in each.

Each host is a network namespace with its own address on a bridge this harness creates (the
machine's side of the bridge has .254), Debian's sshd listening on it (`ip netns exec`; its own
config, host key and authorized key under the test's directory, so nothing of the machine's ssh
set-up is used or changed), and tests/fleet_host.py: the host's instances under the real supervisor
and the real router. Nothing here starts systemd: the namespaces share the machine's /tmp.
Hosts share the file system too, so each has its own directory (HOSTDIR: etc/dflash, opt/dflash,
var/lib) and the inventory points the role at it, where a real host would use /etc/dflash and
/opt/dflash.

The stack a host runs is a build made by `dflashctl upgrade` from a requirements file with hashes:
here one wheel, `sglang`, whose `sglang.launch_server` runs the stand-in SGLang
(tests/data/service/standin_server.py, which parses 0.5.11's flags) with the build's behaviour in
its environment, so `dflashctl serve` starts it exactly as it starts SGLang (`python -m
sglang.launch_server ...`). `stack_wheel` makes one per behaviour.
"""

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
import zipfile
from pathlib import Path

import pytest

from dflashctl.smoke import ports

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "data" / "service" / "standin_server.py"
AGENT = REPO / "tests" / "fleet_host.py"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ADMIN_KEY = "fleet-admin-key"  # each host router's admin API key (it listens beyond loopback)
IS_ROOT = os.geteuid() == 0
needs_fleet = pytest.mark.skipif(
    not IS_ROOT or not os.path.exists(SSHD) or shutil.which("ip") is None or shutil.which("ansible-playbook",
    path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])) is None,
    reason="the fleet tests need root (network namespaces), Debian's openssh-server (sshd), iproute2 and "
           "ansible-core (pip install -e 'python[test]'); tests/run installs them as root")

LAUNCH = '''"""The stand-in SGLang of build {tag!r} (tests/fleet_harness.py): runs standin_server.py with its behaviour."""
import os
import runpy
import sys

BEHAVIOUR = {{"STANDIN_VERSION": {version!r}, **{behaviour!r}}}  # /server_info names the build, as SGLang's does
STANDIN = {standin!r}
os.environ.update(BEHAVIOUR)
sys.path.insert(0, os.path.dirname(STANDIN))
sys.argv = [STANDIN] + sys.argv[1:]
runpy.run_path(STANDIN, run_name="__main__")
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def stack_wheel(directory: Path, tag: str, behaviour: dict[str, str]) -> tuple[Path, str]:
    """A wheel `sglang==0.5.11+<tag>` whose launch_server is the stand-in with `behaviour` in its
    environment; (the wheel, its requirements line with the hash pip --require-hashes checks)."""
    version = f"0.5.11+{tag}"
    dist = f"sglang-{version}.dist-info"
    files = {
        "sglang/__init__.py": f'"""Stand-in SGLang build {tag} (tests only)."""\n__version__ = "{version}"\n'.encode(),
        "sglang/launch_server.py": LAUNCH.format(tag=tag, behaviour=behaviour, standin=str(STANDIN),
                                                 version=version).encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fleet_harness\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            z.writestr(info, data)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return path, f"sglang=={version} --hash=sha256:{sha}\n"


def requirements(tmp: Path, tag: str, behaviour: dict[str, str]) -> Path:
    """A requirements file with the hash of the stand-in build `tag` (its wheel in tmp/wheels)."""
    _, line = stack_wheel(tmp / "wheels", tag, behaviour)
    path = tmp / f"requirements-{tag}.txt"
    path.write_text(line)
    return path


def pip_env(tmp: Path) -> dict[str, str]:
    """pip's settings for the builds: the stand-in wheels of tmp/wheels, no index."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp / "wheels"), "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _ip(*args: str, ns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


def _wait_port(address: str, port: int, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {address}:{port}: {log.read_text(errors='replace')[-2000:]}")


class Host:
    def __init__(self, fleet: "Fleet", index: int):
        self.name = f"host{index}"
        self.ns = f"dflash-{fleet.token}-{index}"
        self.address = f"{fleet.prefix}.{index}"
        self.dir = fleet.tmp / self.name
        self.agent: subprocess.Popen | None = None
        self.sshd: subprocess.Popen | None = None

    @property
    def root(self) -> Path:
        return self.dir / "opt" / "dflash"

    def settings_files(self) -> list[Path]:
        return sorted((self.dir / "etc" / "dflash").glob("*.json"))

    def events(self) -> list[dict]:
        path = self.dir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def starts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events():
            if e["event"] == "start":
                out[e["instance"]] = out.get(e["instance"], 0) + 1
        return out

    def agent_info(self) -> dict:
        return json.loads((self.dir / "agent.json").read_text())


class Fleet:
    """`Fleet(tmp, n).up(instances, first_build)`; `down()` always, even after a failed `up`."""

    def __init__(self, tmp: Path, n: int = 3):
        self.tmp, self.token = tmp, uuid.uuid4().hex[:6]
        self.bridge = f"dfb{self.token}"
        self.prefix = f"10.{200 + int(self.token[:2], 16) % 50}.{int(self.token[2:4], 16)}"
        self.hosts = [Host(self, i + 1) for i in range(n)]
        self.key = tmp / "ssh" / "id_ed25519"

    def _ssh_keys(self) -> None:
        d = self.tmp / "ssh"
        d.mkdir(mode=0o700)
        for key in (self.key, d / "host_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
        shutil.copy(f"{self.key}.pub", d / "authorized_keys")

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.prefix}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for h in self.hosts:
            outside, inside = f"dfv{self.token}{h.name[-1]}", "eth0"
            _ip("netns", "add", h.ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", f"dfp{self.token}{h.name[-1]}")
            _ip("link", "set", f"dfp{self.token}{h.name[-1]}", "netns", h.ns)
            _ip("link", "set", f"dfp{self.token}{h.name[-1]}", "name", inside, ns=h.ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("addr", "add", f"{h.address}/24", "dev", inside, ns=h.ns)
            _ip("link", "set", inside, "up", ns=h.ns)
            _ip("link", "set", "lo", "up", ns=h.ns)

    def _sshd(self, h: Host) -> None:
        config = h.dir / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {h.address}:22", f"HostKey {self.tmp / 'ssh' / 'host_ed25519'}",
            f"PidFile {h.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.tmp / 'ssh' / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM yes", "StrictModes no", "Subsystem sftp internal-sftp", "MaxStartups 50", ""]))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory (Debian's unit makes it)
        log = h.dir / "sshd.log"
        h.sshd = subprocess.Popen(["ip", "netns", "exec", h.ns, SSHD, "-D", "-e", "-f", str(config)],
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT)
        _wait_port(h.address, 22, 30, f"sshd of {h.name}", log)

    def up(self, instances: dict[str, dict], build_env: dict[str, str], install,
           remote_workers: bool = False) -> "Fleet":
        """Every host serving: its settings, the first build installed by `install(host)`, the agent;
        with `remote_workers`, each host's router also lists the other hosts' instances."""
        self._ssh_keys()
        self._network()
        for h in self.hosts:
            (h.dir / "etc" / "dflash").mkdir(parents=True)
            (h.dir / "run").mkdir()
            for name, settings in instances.items():
                (h.dir / "etc" / "dflash" / f"{name}.json").write_text(json.dumps({"name": name, **settings}))
            install(h)
            if remote_workers:
                (h.dir / "remote-workers.json").write_text(json.dumps(
                    [f"http://{o.address}:{s['port']}" for o in self.hosts if o is not h for s in instances.values()]))
            self._sshd(h)
            log = h.dir / "agent.log"
            h.agent = subprocess.Popen(["ip", "netns", "exec", h.ns, sys.executable, str(AGENT), str(h.dir)],
                                       stdout=open(log, "w"), stderr=subprocess.STDOUT, env=build_env)
        for h in self.hosts:
            deadline = time.monotonic() + 180
            while not (h.dir / "agent.json").exists():
                if h.agent.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{h.name} did not start: {(h.dir / 'agent.log').read_text()[-3000:]}")
                time.sleep(0.2)
        return self

    def router_urls(self) -> list[str]:
        return [f"http://{h.address}:30080" for h in self.hosts]

    def inventory(self, common: dict, per_host) -> dict:
        hosts = {}
        for h in self.hosts:
            hosts[h.name] = {"ansible_host": h.address, **per_host(h)}
        return {"dflash": {"hosts": hosts, "vars": {
            "ansible_user": "root", "ansible_ssh_private_key_file": str(self.key),
            "ansible_python_interpreter": sys.executable, **common}}}

    def down(self) -> None:
        for h in self.hosts:
            for proc in (h.agent, h.sshd):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        for h in self.hosts:
            for proc in (h.agent, h.sshd):
                if proc is not None:
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


class Prometheus:
    """Debian's prometheus on 127.0.0.1 of the machine, scraping what `scrape_configs` names."""

    def __init__(self, bin_dir: Path, tmp: Path, scrape_configs: list[dict], rules: str):
        self.bin, self.tmp = bin_dir / "prometheus", tmp
        self.port = ports.free_port(65535)
        (tmp / "prometheus.json").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules], "scrape_configs": scrape_configs}))
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Prometheus":
        log = self.tmp / "prometheus.log"
        self.proc = subprocess.Popen([str(self.bin), "--config.file=prometheus.json", "--storage.tsdb.path=tsdb",
                                      f"--web.listen-address=127.0.0.1:{self.port}"], cwd=self.tmp,
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT)
        _wait_port("127.0.0.1", self.port, 60, "prometheus", log)
        return self

    def query(self, q: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except OSError:
            return []
        return body["data"]["result"] if body.get("status") == "success" else []

    def until(self, read, want, timeout: float = 90.0):
        """`read()` until it equals `want` or `timeout` passes; its last value."""
        deadline = time.monotonic() + timeout
        while (got := read()) != want and time.monotonic() < deadline:
            time.sleep(1)
        return got

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ansible_playbook(fleet: Fleet, playbook: Path, tmp: Path, common: dict) -> tuple[subprocess.CompletedProcess, float]:
    """`ansible-playbook` over the fleet's hosts, each pointed at its own directories, its agent's
    restart command and router settings; `common` are the inventory's other variables. (Its result,
    seconds; the output also in tmp/play-<playbook>-<n>.log.)"""
    bin_dir = Path(sys.executable).parent

    def per_host(h):
        agent = h.agent_info()
        return {"dflash_root": str(h.root), "dflash_settings_dir": str(h.dir / "etc" / "dflash"),
                "dflash_state_dir": str(h.dir / "var" / "lib" / "dflash-rollout"),
                "dflash_restart_command": agent["restart_command"], "dflash_router_settings": agent["router_settings"]}
    n = len(list(tmp.glob("inventory-*.yml")))
    inventory = tmp / f"inventory-{n}.yml"
    inventory.write_text(json.dumps(fleet.inventory(common, per_host)))  # JSON is YAML
    (tmp / "cp").mkdir(exist_ok=True)
    cfg = tmp / "ansible.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = False\nforks = 5\ninterpreter_python = auto_silent\n"
                   f"remote_tmp = {tmp}/remote\nlocal_tmp = {tmp}/local\n"
                   "[ssh_connection]\npipelining = True\n"
                   f"control_path_dir = {tmp}/cp\n"
                   "ssh_args = -o ControlMaster=auto -o ControlPersist=120s -o UserKnownHostsFile=/dev/null "
                   "-o StrictHostKeyChecking=no -o LogLevel=ERROR\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOME=str(tmp / "ansible-home"),
               ANSIBLE_NOCOLOR="1", PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    t0 = time.monotonic()
    r = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(playbook), "-v"], env=env,
                       capture_output=True, text=True, timeout=1200)
    (tmp / f"play-{playbook.stem}-{n}.log").write_text(r.stdout + r.stderr)  # kept for a failing run's reader
    return r, time.monotonic() - t0
