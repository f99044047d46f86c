"""A Debian container booted with its own systemd, for the `systemd` tier (tests/service/test_systemd.py).

The root is built once with debootstrap and cached outside the repository
($DFLASH_TEST_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dflash-tests/systemd/<suite>-<key>/root);
the key changes with the recipe, so a changed recipe builds a new root. Each boot is
`systemd-nspawn --volatile=overlay`: what the tests write lands in a tmpfs over the cached root and
is gone at shutdown. The host needs no systemd as PID 1 and no system bus (--register=no,
--keep-unit); commands run inside through `nsenter -t <container's PID 1> -a`. The container has
its own network (loopback only), its own /tmp and never sees the machine's /tmp.
"""

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

# Debian suite -> the systemd major version it ships.
SUITES = {"trixie": 257, "bookworm": 252}
PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "python3-packaging",
            "python3-setuptools", "g++"]
EXTRA_PACKAGES = {"bookworm": ["python3-wheel"]}  # its setuptools 66 builds wheels only with `wheel`
RECIPE = 1  # bump when how a root is made changes
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BUILD_TIMEOUT_S = 1200
BOOT_TIMEOUT_S = 90
SHUTDOWN_TIMEOUT_S = 30
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unavailable() -> str | None:
    """Why the tier cannot run on this machine, or None."""
    if os.environ.get("DFLASH_SYSTEMD") == "0":
        return "DFLASH_SYSTEMD=0"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (systemd-nspawn boots the container)"
    missing = [t for t in ("systemd-nspawn", "debootstrap", "nsenter") if shutil.which(t) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian: apt-get install systemd-container "
                "debootstrap; tests/run does this when it runs as root)")
    return None


def cache_dir() -> Path:
    if os.environ.get("DFLASH_TEST_CACHE"):
        return Path(os.environ["DFLASH_TEST_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "dflash-tests"


def packages(suite: str) -> list[str]:
    return PACKAGES + EXTRA_PACKAGES.get(suite, [])


def root_key(suite: str) -> str:
    recipe = json.dumps({"suite": suite, "packages": packages(suite), "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """rm -rf, after unmounting what an interrupted debootstrap left mounted inside (proc, sys)."""
    if not path.exists():
        return
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], check=True, timeout=60)
    if _mounts_under(path):
        raise RuntimeError(f"{path} still has mounts; not removing it")
    shutil.rmtree(path)


def ensure_root(suite: str, log=print) -> Path:
    """The cached root of `suite`, built with debootstrap on first use (a lock keeps builds single)."""
    base = cache_dir() / "systemd"
    final = base / f"{suite}-{root_key(suite)}"
    if (final / "ok").exists():
        return final / "root"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "ok").exists():
            return final / "root"
        partial = base / f"{final.name}.partial"
        _remove_tree(partial)
        _remove_tree(final)
        partial.mkdir()
        mirror = os.environ.get("DFLASH_DEBIAN_MIRROR", DEFAULT_MIRROR)
        argv = ["debootstrap", "--variant=minbase", "--include=" + ",".join(packages(suite)), suite,
                str(partial / "root"), mirror]
        log(f"building the {suite} container root (once; cached in {final}): {' '.join(argv)}")
        started = time.monotonic()
        with open(partial / "debootstrap.log", "w") as out:
            r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
        if r.returncode != 0:
            tail = (partial / "debootstrap.log").read_text()[-3000:]
            raise RuntimeError(f"debootstrap {suite} failed ({r.returncode}):\n{tail}")
        _finish_root(partial / "root")
        (partial / "ok").write_text(json.dumps({"suite": suite, "packages": packages(suite), "recipe": RECIPE,
                                                "seconds": round(time.monotonic() - started, 1)}))
        partial.rename(final)
        log(f"built the {suite} root in {time.monotonic() - started:.0f} s")
    return final / "root"


def _finish_root(root: Path) -> None:
    # No login prompt on the pipe console, no waiting for a network that a private netns lacks.
    for unit in ("console-getty.service", "getty@.service", "systemd-networkd-wait-online.service"):
        link = root / "etc/systemd/system" / unit
        if not link.exists():
            link.symlink_to("/dev/null")
    (root / "etc/hostname").write_text("dflash-test\n")


MACHINE_PREFIX = "dflash-test-"  # + the pid of the test process that booted it


def reap_orphans() -> list[int]:
    """Kill containers whose test process is gone (killed before its finalizers ran); returns their pids.

    Only nspawn processes named MACHINE_PREFIX<pid> whose <pid> no longer exists: a container of
    another test session that is still running is left alone.
    """
    reaped = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"systemd-nspawn"):
            continue
        owner = next((a[len(b"--machine=" + MACHINE_PREFIX.encode()):] for a in argv
                      if a.startswith(b"--machine=" + MACHINE_PREFIX.encode())), b"")
        if owner.isdigit() and not Path(f"/proc/{int(owner)}").exists():
            try:
                os.killpg(int(entry.name), signal.SIGKILL)  # booted with its own process group
                reaped.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return reaped


class Container:
    """One booted container. Always end it with shutdown() (the fixture's finalizer does)."""

    def __init__(self, root: Path, log_path: Path):
        self.root, self.log_path = root, log_path
        self.proc: subprocess.Popen | None = None
        self.pid1: int | None = None

    # --- life cycle ------------------------------------------------------------------------------
    def boot(self, timeout: float = BOOT_TIMEOUT_S) -> float:
        """Start systemd in the container; returns the seconds until it reports the system up."""
        for pid in reap_orphans():
            print(f"killed the container of a test process that is gone (systemd-nspawn {pid})")
        started = time.monotonic()
        argv = ["systemd-nspawn", "-D", str(self.root), "--boot", "--register=no", "--keep-unit",
                "--console=pipe", "--private-network", "--volatile=overlay",
                f"--machine={MACHINE_PREFIX}{os.getpid()}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Own process group and session: shutdown() can end everything it started at once.
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.shutdown)
        end = started + timeout
        while self.pid1 is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > end:
                raise RuntimeError(f"the container's systemd did not appear in {timeout:.0f} s:\n"
                                   f"{self.log_tail()}")
            self.pid1 = self._find_pid1()
            time.sleep(0.1)
        while True:  # until systemd answers on its socket, then until start-up has finished
            r = self.run(["systemctl", "is-system-running", "--wait"], check=False,
                         timeout=max(1.0, end - time.monotonic()))
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"the container's systemd is {state!r} ({r.stderr.strip()}):\n"
                                   f"{self.log_tail()}")
            time.sleep(0.2)
        if state == "degraded":
            failed = self.run(["systemctl", "--failed", "--no-legend"], check=False).stdout
            print(f"container booted degraded; failed units:\n{failed}")
        return time.monotonic() - started

    def _find_pid1(self) -> int | None:
        """The container's init: the nspawn descendant that is PID 1 in its own PID namespace."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        todo = list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                comm = Path(f"/proc/{pid}/comm").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                # nspawn's own inner child is PID 1 too, until it execs systemd.
                return pid if "systemd" in comm else None
            todo.extend(children.get(pid, []))
        return None

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Power the container off (SIGTERM to nspawn), then SIGKILL its process group if it lingers."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to power off
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the PID namespace dies with its init
            except ProcessLookupError:
                pass
            self.proc.wait()
            atexit.unregister(self.shutdown)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no console log)"

    # --- inside ----------------------------------------------------------------------------------
    def run(self, argv: list[str], check: bool = True, timeout: float = 60, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run argv in every namespace of the container, with a clean environment."""
        clean = {"PATH": PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0",
                 "SYSTEMD_LESS": "", **(env or {})}
        full = ["nsenter", "-t", str(self.pid1), "-a", "--", "env", "-i",
                *(f"{k}={v}" for k, v in clean.items()), *argv]
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise RuntimeError(f"in the container: {' '.join(argv)} exited {r.returncode}:\n"
                               f"{r.stdout}{r.stderr}")
        return r

    def path(self, inside: str) -> Path:
        """A path in the container's file system, as seen from the host (through its mount namespace)."""
        return Path(f"/proc/{self.pid1}/root") / inside.lstrip("/")

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        p = self.path(inside)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)

    def copy_tree(self, source: Path, inside: str) -> None:
        shutil.copytree(source, self.path(inside), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
