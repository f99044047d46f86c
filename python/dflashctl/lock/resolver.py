"""Drive uv's resolver: a throw-away project whose uv.lock covers every system of the spec.

uv resolves all systems in one universal pass (`environments`), refuses sdists (`no-build`) and
hides newer uploads (`exclude-newer`). We read its uv.lock and never keep it: the URLs in it
name the index host, and the lock we commit must not.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.lock.spec import Spec
from dflashctl.systems import SYSTEMS


def uv_binary() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        raise DflashError("`dflashctl lock` needs uv", "the `uv` Python package is not installed",
                          "pip install 'dflashctl[lock]' (pins uv==0.13.9)") from None
    return find_uv_bin()


def environment_marker(spec: Spec, system: str) -> str:
    return (f"python_version == '{spec.python}' and sys_platform == 'linux'"
            f" and platform_machine == '{SYSTEMS[system]}'")


def _python_range(target: str) -> str:
    """requires-python spanning the target and the interpreter uv runs on (it refuses to lock a
    project that excludes it). Narrow on purpose: uv.lock then lists no cp313+ wheels, halving
    the file we parse. The target itself is fixed by the environment markers."""
    running = sys.version_info[:2]
    wanted = tuple(int(p) for p in target.split("."))
    lo, hi = min(running, wanted), max(running, wanted)
    return f">={lo[0]}.{lo[1]}, <{hi[0]}.{hi[1] + 1}"


def project_toml(spec: Spec) -> str:
    """The throw-away pyproject.toml: JSON strings are valid TOML basic strings."""
    q = json.dumps
    envs = "[" + ", ".join(q(environment_marker(spec, s)) for s in spec.systems) + "]"
    return "\n".join([
        "[project]",
        'name = "dflash-stack"',
        'version = "0"',
        f"requires-python = {q(_python_range(spec.python))}",
        f"dependencies = [{', '.join(q(r) for r in spec.requirements)}]",
        "[dependency-groups]",
        f"dev = [{', '.join(q(r) for r in spec.dev_requirements)}]",
        "[tool.uv]",
        "package = false",
        f"environments = {envs}",
        f"required-environments = {envs}",  # fail unless every system gets a wheel of everything
        f"exclude-newer = {q(spec.exclude_newer)}",
        "no-build = true",  # wheels only: an sdist would have to be built on the host
        "",
    ])


class Ticker:
    """Elapsed seconds on stderr while something slow runs (a line every 10 s when not a tty)."""

    def __init__(self, label: str, quiet: bool = False):
        self.label, self.quiet, self.start = label, quiet, time.monotonic()
        self.failed = False  # set by the caller when the work failed without raising
        self._stop = threading.Event()
        self._tty = sys.stderr.isatty()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        every = 1 if self._tty else 10
        while not self._stop.wait(every):
            elapsed = time.monotonic() - self.start
            end = "\r" if self._tty else "\n"
            print(f"{self.label} … {elapsed:.0f} s", end=end, file=sys.stderr, flush=True)

    def __enter__(self):
        if not self.quiet:
            print(f"{self.label} …", file=sys.stderr, flush=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if not self.quiet:
            self._thread.join()
            state = "failed" if exc[0] or self.failed else "done"
            print(f"{self.label}: {state} in {time.monotonic() - self.start:.1f} s" + " " * 10,
                  file=sys.stderr, flush=True)


def warm_up() -> None:
    """Imports the steps after uv need (ssl alone takes ~0.1 s), done while uv runs."""
    import concurrent.futures  # noqa: F401
    import tomllib  # noqa: F401
    import urllib.request  # noqa: F401


def run_uv_lock(spec: Spec, quiet: bool = False) -> str:
    """Resolve `spec` with `uv lock`; the uv.lock text, or a DflashError saying why not."""
    uv = uv_binary()
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", NO_COLOR="1")
    with tempfile.TemporaryDirectory(prefix="dflash-lock-") as tmp:
        Path(tmp, "pyproject.toml").write_text(project_toml(spec))
        label = f"resolving {len(spec.requirements)} requirements for {', '.join(spec.systems)} with uv"
        with Ticker(label, quiet) as ticker:
            proc = subprocess.Popen([uv, "lock", "--python", sys.executable, "--directory", tmp],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
            try:
                warm_up()
                _, stderr = proc.communicate()
            finally:
                if proc.poll() is None:  # interrupted: take uv down with us
                    proc.kill()
                    proc.wait()
            ticker.failed = proc.returncode != 0
        if proc.returncode != 0:
            raise uv_failure(stderr)
        return Path(tmp, "uv.lock").read_text()


def uv_failure(stderr: str) -> DflashError:
    # Drop uv's chatter and its hint about the interpreter it ran on (the targets are the markers).
    lines = [line.strip() for line in stderr.splitlines() if line.strip()
             and not line.startswith(("Using CPython", "Resolved", "hint: While the active Python"))]
    text = "; ".join(lines)[-1500:] or "uv exited without a message"
    lowered = text.lower()
    if "compatible wheels" in lowered:
        what = "a required package has no wheel for one of the systems"
        fix = ("pin a version that has wheels for every system in nix/stack.toml, or drop the system "
               "from `systems`")
    elif "no solution found" in lowered or "unsatisfiable" in lowered:
        fix = "change the pins in nix/stack.toml (or move exclude-newer) so that they agree"
        what = "the requirements in nix/stack.toml cannot be satisfied"
    elif any(s in lowered for s in ("network", "connect", "dns", "timed out", "timeout", "tls",
                                    "failed to fetch", "error sending request")):
        fix = "check the connection to the package index and run `dflashctl lock` again"
        what = "the package index could not be reached while resolving"
    else:
        fix = "read uv's message above; fix nix/stack.toml and run `dflashctl lock` again"
        what = "uv could not resolve the stack"
    return DflashError(what, f"uv says: {text}", fix + " (nothing was written)")


def wheel_urls(uv_lock_text: str, name: str, python: str) -> list[str]:
    """URLs of `name`'s Linux wheels for `python` in raw uv.lock text: lets the metadata fetch
    start before the (slower) TOML parse."""
    cp = "cp" + python.replace(".", "")
    return re.findall(rf'url = "([^"]*/{re.escape(name)}-[^"/]*-{cp}-[^"/]*linux[^"/]*\.whl)"', uv_lock_text)


def requires_dist(url: str, timeout: float = 60) -> list[str]:
    """A wheel's Requires-Dist lines, from its METADATA."""
    from dflashctl.lock.wheelfetch import metadata_text
    text = metadata_text(url, timeout=timeout)
    head = text.split("\n\n", 1)[0]  # headers end at the first blank line; the body is the README
    return [line.split(":", 1)[1].strip() for line in head.splitlines()
            if line.startswith("Requires-Dist:")]
