"""A source-tree SGLang (`sglangSrc` a checkout, docs/nix.md) through the steps nixpkgs' hooks take
for it, without nixpkgs, on tests/data/nix/sglang-tree (a tree of our own in 0.5.11's shape) and,
given DFLASH_SGLANG_TREE, on a real checkout:

1. unpack: the fix-up's postUnpack (the build runs in python/) and postPatch (the Rust extension
   left out), run under bash as stdenv runs them;
2. pypaBuildHook: `python -m build --no-isolation --outdir dist/ --wheel` with the fix-up's env
   (SETUPTOOLS_SCM_PRETEND_VERSION), in an environment of the build requirements the tree names:
   setuptools, packaging and build at the lock's versions, setuptools-scm, setuptools-rust and wheel
   as the index had them at the stack's exclude-newer (nixpkgs' in a real build);
3. pythonRelaxDepsHook with the fix-up's pythonRelaxDeps = true: every Requires-Dist of the wheel's
   METADATA loses its version specifier;
4. pythonRuntimeDepsCheckHook: every Requires-Dist whose marker holds on the target must be
   installed in a version its specifier allows (prereleases allowed); installed = the lock's
   dependencies of sglang at their locked versions (as metadata, which is all the check reads).

Steps 3 and 4 are our own code written from the hooks' source; step 2 is the real build backend.
"""

import email.parser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO, nix_or_skip
from nixeval import eval_json

pytestmark = pytest.mark.nix
TREE = REPO / "tests" / "data" / "nix" / "sglang-tree"
LOCK = json.loads((REPO / "nix" / "python-lock.json").read_text())
MACHINE = {"x86_64-linux": "x86_64", "aarch64-linux": "aarch64"}


# --- steps 3 and 4: the relaxation and the runtime-dependency check ------------------------------

def relax_all(requires: list[str]) -> list[str]:
    """pythonRelaxDeps = true: each requirement without its version specifier (marker kept)."""
    out = []
    for line in requires:
        r = Requirement(line)
        r.specifier = type(r.specifier)()
        out.append(str(r))
    return out


def locked_dependencies(system: str) -> dict[str, str]:
    """What the Nix build of sglang has installed: the lock's sglang dependencies, name -> version."""
    packages = LOCK["systems"][system]["packages"]
    return {name: packages[name]["version"] for name in packages["sglang"]["dependencies"]}


def runtime_check(requires: list[str], installed: dict[str, str], system: str) -> list[str]:
    """The problems pythonRuntimeDepsCheckHook would print, for the target `system` (Python 3.12)."""
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": MACHINE[system], "python_version": "3.12", "python_full_version": "3.12.0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    have = {canonicalize_name(k): v for k, v in installed.items()}
    problems = []
    for line in requires:
        r = Requirement(line)
        if r.marker and not r.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(r.name)
        if name not in have:
            problems.append(f"{name} not installed")
            continue
        r.specifier.prereleases = True
        if r.specifier and have[name] not in r.specifier:
            problems.append(f"{name}{r.specifier} not satisfied by version {have[name]}")
    return problems


def tree_requirements(pyproject: Path) -> list[str]:
    """Requires-Dist as a PEP 517 backend writes it from [project] (extras gated by `extra`)."""
    import tomllib
    project = tomllib.loads(pyproject.read_text())["project"]
    out = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [f"{r} ; extra == {extra!r}" if ";" not in r else f"{r} and extra == {extra!r}" for r in reqs]
    return out


@pytest.mark.parametrize("system", sorted(LOCK["systems"]))
def test_the_lock_meets_a_0_5_11_tree_and_relaxing_keeps_the_presence_check(system):
    """0.5.11's own pins are what the lock was resolved from: the check passes unrelaxed. A patched
    tree pinning another version fails it until relaxed; a requirement the lock does not have
    fails it relaxed too (the lock must be changed: nix/stack.toml)."""
    requires = tree_requirements(TREE / "python" / "pyproject.toml")
    installed = locked_dependencies(system)
    assert runtime_check(requires, installed, system) == []
    # the platform markers were evaluated for the target, not for this machine
    assert ("decord2" in installed) == (system == "aarch64-linux")
    patched = [("xgrammar==0.2.1" if r.startswith("xgrammar") else r) for r in requires]
    assert runtime_check(patched, installed, system) == [
        "xgrammar==0.2.1 not satisfied by version " + installed["xgrammar"]]
    assert runtime_check(relax_all(patched), installed, system) == []
    assert runtime_check(relax_all(patched + ["sglang-ddtree-extras>=1"]), installed, system) == [
        "sglang-ddtree-extras not installed"]


# --- steps 1 and 2: the fix-up's scripts and the PEP 517 build ------------------------------------

@pytest.fixture(scope="module")
def fixup():
    """The sglang fix-up's arguments for a source tree (tests/nix/build-wheel.nix)."""
    return eval_json(nix_or_skip(), REPO / "tests/nix/build-wheel.nix")["sglang"]["sourceTree"]


@pytest.fixture(scope="module")
def build_env(tmp_path_factory):
    """A venv with the build requirements (network: the index)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not os.access(uv, os.X_OK):
        pytest.skip("needs uv (pip install -e './python[test]' brings it)")
    venv = tmp_path_factory.mktemp("build-env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    x86 = LOCK["systems"]["x86_64-linux"]["packages"]
    pinned = [f"{n}=={x86[n]['version']}" for n in ("setuptools", "packaging", "build", "pyproject-hooks")]
    done = subprocess.run([uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--exclude-newer",
                           LOCK["exclude_newer"], *pinned, "setuptools-scm", "setuptools-rust", "wheel"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"the build requirements could not be installed: {done.stderr[-400:]}")
    return venv / "bin" / "python"


def unpack(tree: Path, fixup: dict, where: Path, patch: bool = True) -> Path:
    """A copy of `tree`, after the fix-up's postUnpack and postPatch: the directory the build runs in."""
    src = where / tree.name
    shutil.copytree(tree, src, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build",
                                                             "dist"))
    shims = where / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "python3.12").unlink(missing_ok=True)
    (shims / "python3.12").symlink_to(sys.executable)  # the stand-in python.interpreter of build-wheel.nix
    script = (f'set -euo pipefail\ncd {where}\nsourceRoot={tree.name}\n{fixup["postUnpack"]}\ncd "$sourceRoot"\n'
              + (fixup["postPatch"] if patch else "") + '\npwd\n')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"PATH": f"{shims}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.splitlines()[-1])


def pep517(python: Path, source: Path, env: dict) -> tuple[subprocess.CompletedProcess, Path | None]:
    """pypaBuildHook's build; no cargo on PATH, as in the sandbox."""
    done = subprocess.run([str(python), "-m", "build", "--no-isolation", "--outdir", "dist/", "--wheel"],
                          cwd=source, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(source), **env})
    wheels = sorted((source / "dist").glob("*.whl"))
    return done, (wheels[0] if wheels else None)


def metadata(wheel: Path) -> tuple[email.message.Message, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(name).decode())
    return msg, msg.get_all("Requires-Dist") or []


@pytest.mark.network
def test_our_0_5_11_shaped_tree_builds_as_the_hooks_build_it(fixup, build_env, tmp_path):
    source = unpack(TREE, fixup, tmp_path / "ok")
    assert source.name == "python"
    assert "setuptools-rust" not in (source / "pyproject.toml").read_text().split("[build-system]")[1].split(
        "[project]")[1]  # the ext-modules table is gone, the build requirement stays
    done, wheel = pep517(build_env, source, fixup["env"])
    assert done.returncode == 0, done.stderr[-2000:]
    version = fixup["env"]["SETUPTOOLS_SCM_PRETEND_VERSION"]
    assert wheel.name == f"sglang-{version}-py3-none-any.whl"  # no extension: a pure wheel
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert f"__version__ = version = '{version}'" in z.read("sglang/_version.py").decode()
    assert not any(n.endswith(".so") for n in names)
    msg, requires = metadata(wheel)
    assert msg["Version"] == version
    # the lock the test's build-wheel.nix uses is a fixture; the real one is what a host builds with
    installed = locked_dependencies("x86_64-linux")
    assert runtime_check(relax_all(requires), installed, "x86_64-linux") == []
    assert runtime_check(requires, installed, "x86_64-linux") == []


@pytest.mark.network
def test_what_the_fixup_prevents(fixup, build_env, tmp_path):
    """Without the postPatch, setuptools-rust wants a Rust compiler (the sandbox has none, nor the crates);
    without the version, setuptools-scm falls back to 0.0.0.dev0 (a fetched tree has no .git)."""
    done, wheel = pep517(build_env, unpack(TREE, fixup, tmp_path / "rust", patch=False), fixup["env"])
    assert done.returncode != 0 and wheel is None
    assert "can't find Rust compiler" in done.stderr, done.stderr[-2000:]
    done, wheel = pep517(build_env, unpack(TREE, fixup, tmp_path / "version"), {})
    assert done.returncode == 0, done.stderr[-2000:]
    assert wheel.name == "sglang-0.0.0.dev0-py3-none-any.whl"


@pytest.mark.network
def test_a_real_checkout(fixup, build_env, tmp_path):
    """DFLASH_SGLANG_TREE=<a checkout of sgl-project/sglang, e.g. at v0.5.11>: the same steps, with
    the real lock's sglang version and dependencies (docs/nix.md records the run at v0.5.11)."""
    root = os.environ.get("DFLASH_SGLANG_TREE")
    if not root:
        pytest.skip("set DFLASH_SGLANG_TREE to an sglang checkout (outside the repository) to build it")
    version = LOCK["systems"]["x86_64-linux"]["packages"]["sglang"]["version"]
    source = unpack(Path(root), fixup, tmp_path)
    done, wheel = pep517(build_env, source, {"SETUPTOOLS_SCM_PRETEND_VERSION": version})
    print(done.stdout[-1500:], done.stderr[-1500:])
    assert done.returncode == 0, done.stderr[-3000:]
    assert wheel.name == f"sglang-{version}-py3-none-any.whl"
    _, requires = metadata(wheel)
    for system in sorted(LOCK["systems"]):
        installed = locked_dependencies(system)
        print(system, "unrelaxed:", runtime_check(requires, installed, system) or "ok")
        assert runtime_check(relax_all(requires), installed, system) == [], system
