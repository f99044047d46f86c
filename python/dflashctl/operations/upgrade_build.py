"""Where `dflashctl upgrade` puts a new build of the stack: one directory per build, never in place.

A build is installed next to the one serving, in `<root>/builds/<id>/`, and nothing running is
touched: installing into the live environment would let an instance that has not restarted yet
import a module of the new version beside the old ones it already loaded. `<root>/current` is a
symlink to the build the host is meant to run; `upgrade` moves it before the rollout and back when
the rollout stops (a supervisor that starts `<root>/current/bin/...` resolved at each start, as
docs/fleet.md shows, then starts a crashed instance on the build the host still serves).

- pip: `python -m venv <dir>`, then `pip install --no-deps --require-hashes -r REQUIREMENTS` (the
  lock exported by `dflashctl export`) and, with `--glue`, dflashctl itself (`--no-deps`: its one
  dependency is in the lock). The id is a digest of the requirements, the glue and the interpreter,
  so the same inputs give the same directory and a second run installs nothing. pip's own settings
  (PIP_INDEX_URL, PIP_FIND_LINKS, pip.conf) say where the wheels come from.
- nix: `nix build --no-link --json INSTALLABLE` gives the store path; its hash part is
  the id, and `nix profile install --profile <root>/builds/<id> PATH` keeps it (a profile is a
  garbage-collector root), so `<root>/builds/<id>/bin/python` is the stack's interpreter.

A directory without its marker (`.dflash-build.json`, written last) is a build that did not finish:
it is removed and installed again.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dflashctl import inputs, output
from dflashctl.errors import CONFIG, FAILED, INPUT, OUTPUT, DflashError

MARKER = ".dflash-build.json"
INSTALL_TIMEOUT_S = 3600  # the full stack is ~3.6 GiB of wheels on a first install
TAIL_LINES = 15


@dataclass(frozen=True)
class Build:
    id: str
    path: Path  # <root>/builds/<id>
    how: str  # pip | nix
    installed: bool  # False: it was there already

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def dflashctl(self) -> Path | None:
        """The build's own dflashctl, when the glue was installed into it."""
        exe = self.path / "bin" / "dflashctl"
        return exe if exe.exists() else None

    def sglang_version(self) -> str | None:
        """The SGLang version the build installs (its dist-info), as its /server_info will report it."""
        for dist in sorted(self.path.glob("lib/python3*/site-packages/sglang-*.dist-info")):
            return dist.name[len("sglang-"):-len(".dist-info")]
        return None

    def to_json(self) -> dict:
        return {"id": self.id, "path": str(self.path), "how": self.how, "installed": self.installed,
                "sglang": self.sglang_version()}


def say(text: str) -> None:
    print(f"dflashctl upgrade: {text}", file=sys.stderr, flush=True)


def _tail(text: str) -> str:
    return "\n".join((text or "").strip().splitlines()[-TAIL_LINES:]) or "(no output)"


def _run(argv: list[str], what: str, fix: str, timeout: float = INSTALL_TIMEOUT_S) -> str:
    """Run one install step; its failure is FAILED (nothing was restarted) with its output's tail."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise DflashError(f"{what}: {argv[0]} not found", "the install step needs it on this host", fix,
                          CONFIG) from None
    except subprocess.TimeoutExpired:
        raise DflashError(f"{what}: still running after {timeout:.0f} s", "the install hangs (network?)",
                          fix, FAILED) from None
    if r.returncode != 0:
        raise DflashError(f"{what} failed (exit {r.returncode}); nothing was restarted",
                          _tail(r.stderr + r.stdout), fix, FAILED)
    return r.stdout


def _builds_dir(root: Path) -> Path:
    d = root / "builds"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DflashError(f"cannot create {d}", e.strerror or str(e),
                          "run as root, or pass --root a directory you can write", OUTPUT) from None
    return d


def _marker(path: Path, how: str) -> Path:
    """Inside a pip build; beside a Nix profile (a symlink into the read-only store)."""
    return path / MARKER if how == "pip" else path.with_name(f"{path.name}{MARKER}")


def _finished(path: Path, how: str) -> bool:
    return _marker(path, how).is_file() and path.exists()


def _clear_unfinished(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        say(f"{path} is a build that did not finish installing: installing it again")
        shutil.rmtree(path)


def _mark(path: Path, facts: dict) -> None:
    output.write(_marker(path, facts["how"]), json.dumps(facts, indent=2) + "\n", "the build's marker")


def pip_build(root: Path, requirements: str, glue: str | None, python: str) -> Build:
    req = inputs.read_bytes(requirements, "requirements file", "pass --requirements the file `dflashctl export` "
                            "wrote", INPUT, 64 << 20)
    glue_bytes = inputs.read_bytes(glue, "dflashctl wheel or sdist", "pass --glue a dflashctl wheel "
                                   "(`pip wheel --no-deps ./python`)", INPUT, 512 << 20) if glue else b""
    digest = hashlib.sha256(b"\0".join([req, glue_bytes, python.encode()])).hexdigest()[:16]
    path = _builds_dir(root) / digest
    if _finished(path, "pip"):
        return Build(digest, path, "pip", installed=False)
    _clear_unfinished(path)
    say(f"installing build {digest} into {path} (pip --require-hashes)")
    fix_venv = f"pass --python an interpreter with the venv module (e.g. python3.12), not {python}"
    _run([python, "-m", "venv", str(path)], f"creating the environment {path}", fix_venv, timeout=600)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--no-deps"]
    _run(pip + ["--require-hashes", "-r", os.path.abspath(requirements)], "pip install --require-hashes",
         "check that the requirements come from `dflashctl export` and that pip reaches their index "
         "(PIP_INDEX_URL / pip.conf); then run the upgrade again")
    if glue:
        _run(pip + [os.path.abspath(glue)], "installing dflashctl (--glue)",
             "pass --glue a dflashctl wheel built from this checkout (`pip wheel --no-deps ./python`)")
    _mark(path, {"id": digest, "how": "pip", "requirements_sha256": hashlib.sha256(req).hexdigest(),
                 "glue_sha256": hashlib.sha256(glue_bytes).hexdigest() if glue else None, "python": python})
    return Build(digest, path, "pip", installed=True)


def nix_build(root: Path, installable: str) -> Build:
    fix = ("check the flake reference (e.g. github:OWNER/dflash-stack#dflash-env) and that Nix has flakes on "
           "(experimental-features = nix-command flakes)")
    out = _run(["nix", "build", "--no-link", "--json", installable], f"nix build {installable}", fix)
    try:  # [{"drvPath": ..., "outputs": {"out": PATH}}]: --json, which Nix 2.8 has (--print-out-paths came later)
        paths = [p for d in json.loads(out) for p in d["outputs"].values()]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise DflashError(f"nix build {installable} printed no build result", out[-500:] or "(nothing)",
                          "run it by hand to see what Nix says", FAILED) from None
    if len(paths) != 1:
        raise DflashError(f"nix build {installable} gave {len(paths)} outputs", " ".join(paths) or "none",
                          "name one package (a flake output such as #dflash-env)", CONFIG)
    store_path = paths[0]
    digest = Path(store_path).name.split("-", 1)[0]
    path = _builds_dir(root) / digest
    if _finished(path, "nix"):
        return Build(digest, path, "nix", installed=False)
    _clear_unfinished(path)
    say(f"installing build {digest} ({store_path}) as the profile {path}")
    _run(["nix", "profile", "install", "--profile", str(path), store_path], "nix profile install", fix)
    if not (path / "bin" / "python").exists():
        raise DflashError(f"{store_path} has no bin/python", "the upgrade runs the stack's interpreter from it",
                          "install the stack's environment (the flake's dflash-env), not a single package", CONFIG)
    _mark(path, {"id": digest, "how": "nix", "store_path": store_path, "installable": installable})
    return Build(digest, path, "nix", installed=True)


def current(root: Path) -> str | None:
    """The build id `<root>/current` points at, if any."""
    link = root / "current"
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def point_current(root: Path, build_id: str | None) -> None:
    """Move `<root>/current` to builds/<id> (None: remove it), atomically (a new link renamed over it)."""
    link, tmp = root / "current", root / ".current.new"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        if build_id is None:
            if link.is_symlink():
                link.unlink()
            return
        os.symlink(f"builds/{build_id}", tmp)
        os.replace(tmp, link)
    except OSError as e:
        raise DflashError(f"cannot point {link} at builds/{build_id}", e.strerror or str(e),
                          "run as root, or pass --root a directory you can write", OUTPUT) from None
