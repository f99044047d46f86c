"""The flake's shape, checked offline: every .nix file parses, the outputs the README and the
users' CI rely on exist (listed with a nixpkgs that throws when touched), flake.lock pins the
nixpkgs the issue names."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip, nixfmt_or_skip
from flake_outputs import PER_SYSTEM, SYSTEMS
from nixeval import eval_file, eval_json, nix_env

pytestmark = pytest.mark.nix


def nix_files():
    """Tracked and untracked-but-not-ignored .nix files; every .nix file outside a git checkout
    (the flake's pytest check runs on a plain copy of the source)."""
    done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.nix"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode == 0:
        return sorted(done.stdout.split())
    return sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*.nix") if ".venv" not in p.parts)


@pytest.mark.parametrize("path", nix_files())
def test_parses(path):
    nix_instantiate = str(Path(nix_or_skip()).with_name("nix-instantiate"))
    done = subprocess.run([nix_instantiate, "--parse", path], cwd=REPO, capture_output=True,
                          text=True, env=nix_env())
    assert done.returncode == 0, done.stderr


def test_nix_files_are_nixfmt_formatted():
    """checks.formatting, offline: the same `nixfmt --check` over the same files."""
    nixfmt = nixfmt_or_skip()
    done = subprocess.run([nixfmt, "--check", *nix_files()], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"not in nixfmt's layout (run `nix fmt` or nixfmt FILE):\n{done.stderr}"


def test_outputs_present_without_nixpkgs():
    out = eval_json(nix_or_skip(), REPO / "tests/nix/flake-outputs.nix")
    assert {"packages", "apps", "devShells", "checks", "overlays", "nixosModules",
            "formatter"} <= set(out["outputs"])
    for attr, names in PER_SYSTEM.items():
        assert set(out[attr]) == SYSTEMS, attr
        for system in SYSTEMS:
            assert names <= set(out[attr][system]), (attr, system)
    assert set(out["formatter"]) == SYSTEMS
    assert "default" in out["overlays"]
    module = {"imports": ["module.nix"],
              "defaults": ["dflashctlPackage", "hostCompilerPackage", "kernelsPackage", "package",
                           "router"]}
    assert out["nixosModules"] == {"dflash": module, "default": module}


def test_nixpkgs_is_imported_once_per_system():
    """Every output of a system shares one nixpkgs import (and so one evaluation of the overlay);
    the stand-in nixpkgs traces each import while all per-system outputs are forced."""
    done = eval_file(nix_or_skip(), REPO / "tests/nix/flake-imports.nix")
    assert done.returncode == 0, done.stderr
    imports = sorted(line for line in done.stderr.splitlines() if "stub nixpkgs imported" in line)
    assert imports == [f"trace: stub nixpkgs imported for {s}" for s in sorted(SYSTEMS)]


def test_lock_pins_nixpkgs():
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    assert node["locked"] == {
        "lastModified": 1786862985,
        "narHash": "sha256-FBJRXmbGXiSUDvYEbfLYRkckayyZ6SK1UEqhCrIZ2Cs=",
        "owner": "NixOS",
        "repo": "nixpkgs",
        "rev": "e5bdc4a41d4c072fe1e3787eaa0320a384741d44",
        "type": "github",
    }
    # flake.nix's input URL and the lock's `original` must name the same branch, or Nix
    # re-locks on the next run.
    out = eval_json(nix_or_skip(), REPO / "tests/nix/flake-outputs.nix")
    o = node["original"]
    assert out["inputs"]["nixpkgs"] == f"github:{o['owner']}/{o['repo']}/{o['ref']}"


def test_smoke_app_puts_the_pinned_compiler_first_on_path(tmp_path):
    """`nix run .#dflash-smoke` with a stub nixpkgs (tests/data/flake/stub-nixpkgs): the real overlay
    decides the compiler (gcc14: nvcc 13.0 refuses GCC > 15); running the app shows what PATH
    dflashctl smoke, and so SGLang's nvcc and c++, get."""
    compiler, env = tmp_path / "gcc14", tmp_path / "dflash-env"
    for tool in ("gcc", "c++"):
        script = compiler / "bin" / tool
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    dflashctl = env / "bin" / "dflashctl"
    dflashctl.parent.mkdir(parents=True)
    dflashctl.write_text('#!/bin/sh\necho "PATH=$PATH"\necho "c++=$(command -v c++)"\necho "args=$*"\n')
    dflashctl.chmod(0o755)
    done = subprocess.run([nix_or_skip(), "eval", "--impure", "--raw", "--expr",
                           f"import {REPO}/tests/data/flake/smoke-app.nix {{ }}"], capture_output=True, text=True,
                          env={**nix_env(), "DFLASH_STUB_COMPILER": str(compiler), "DFLASH_STUB_ENV": str(env)},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    ran = subprocess.run(["bash", done.stdout, "--runs", "DFLASH"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    out = dict(line.split("=", 1) for line in ran.stdout.splitlines())
    assert out["PATH"] == f"{compiler}/bin:/usr/bin:/bin"
    assert out["c++"] == f"{compiler}/bin/c++"
    assert out["args"] == "smoke --runs DFLASH"
