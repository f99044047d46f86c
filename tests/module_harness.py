"""nix/module.nix evaluated inside our reduced NixOS (tests/nixos/*.nix) with nixpkgs' lib.

The NixOS option declarations the module touches are written from NixOS's own source with their
real types, merges, assertions and unit rendering, so a unit file comes out as NixOS would write it.
For other tests (issue 17 feeds these units to a real systemd):

    from module_harness import module_unit_text
    text = module_unit_text({"a": {"model": "m", "gpus": [0]}}, "a")

nixpkgs' lib: $DFLASH_NIXPKGS_LIB, else ../shared/nixpkgs-lib next to the repository (CI and
/work/main have it), else $DFLASH_NIXPKGS/lib; `nixpkgs_lib()` is None when none exists.
"""

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EVAL = HERE / "nixos" / "eval.nix"
# SGLang 0.5.11's --speculative-algorithm choices, and a patched SGLang's (tests/test_validate.py)
RELEASE_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"]
PATCHED_ALGORITHMS = RELEASE_ALGORITHMS + ["DDTREE"]


class EvalError(Exception):
    """The evaluation failed (a type error, a throw): NixOS refuses the configuration."""


class AssertionsFailed(Exception):
    """NixOS's `assertions` failed: the system would not build."""

    def __init__(self, messages: list[str]):
        super().__init__("\n".join(messages))
        self.messages = messages


def nixpkgs_lib() -> Path | None:
    candidates = [os.environ.get("DFLASH_NIXPKGS_LIB"), str(REPO.parent / "shared" / "nixpkgs-lib")]
    if os.environ.get("DFLASH_NIXPKGS"):
        candidates.append(os.environ["DFLASH_NIXPKGS"])
    for c in candidates:
        if c and (Path(c) / "lib" / "default.nix").exists():
            return Path(c) / "lib"
    return None


def _stand_in_env(root: Path, choices: list[str]) -> None:
    """A stack env whose bin/python sees a stand-in sglang source tree offering `choices`."""
    srt = root / "site" / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt.parent / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (srt / "__init__.py").write_text("")
    (srt / "server_args.py").write_text(
        "import argparse\nSPEC_CHOICES = " + json.dumps(choices) + "\n"
        "def add(parser):\n"
        "    parser.add_argument('--speculative-algorithm', type=str, choices=SPEC_CHOICES)\n")
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={root / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)


@functools.cache
def harness_dir() -> Path:
    """Real package directories: dflashctl (this checkout's) and two stack envs (release, patched)."""
    root = Path(tempfile.mkdtemp(prefix="dflash-module-harness-"))
    atexit.register(shutil.rmtree, root, True)
    bin_dir = root / "dflashctl" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "dflashctl"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={REPO / 'python'} exec {sys.executable} -m dflashctl \"$@\"\n")
    exe.chmod(0o755)
    _stand_in_env(root / "env-release", RELEASE_ALGORITHMS)
    _stand_in_env(root / "env-ddtree", PATCHED_ALGORITHMS)
    return root


def nix_env() -> dict:
    return {**os.environ, "NIX_CONFIG": "experimental-features = nix-command flakes\nsandbox = false\n"
            "substituters =\nwarn-dirty = false"}


def evaluate(instances: dict, host: str | None = None, flake: bool = False) -> dict:
    """The module's output for `instances` (JSON-able) and a host module (Nix source), as JSON.

    Raises EvalError (stderr) when NixOS would refuse to evaluate it, AssertionsFailed when an
    assertion fails.
    """
    lib = nixpkgs_lib()
    if lib is None:
        raise RuntimeError("no nixpkgs lib: set DFLASH_NIXPKGS_LIB (see module_harness.py)")
    args = ["nix-instantiate", "--eval", "--strict", "--json", "--read-write-mode", str(EVAL),
            "--arg", "lib", f"import {lib}", "--argstr", "instancesJSON", json.dumps(instances),
            "--argstr", "harness", str(harness_dir()), "--arg", "flake", "true" if flake else "false"]
    tmp = None
    if host is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".nix", prefix="dflash-host-", delete=False)
        tmp.write(host)
        tmp.close()
        args += ["--arg", "host", f"import {tmp.name}"]
    try:
        r = subprocess.run(args, capture_output=True, text=True, env=nix_env(), timeout=300)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    if r.returncode != 0:
        raise EvalError(r.stderr)
    out = json.loads(r.stdout)
    if out["failedAssertions"]:
        raise AssertionsFailed(out["failedAssertions"])
    return out


def module_unit_text(instances: dict, name: str, host: str | None = None) -> str:
    """The unit file NixOS writes for instance `name` (dflash-<name>.service)."""
    return evaluate(instances, host)["units"][f"dflash-{name}.service"]


def run_check(check: dict) -> subprocess.CompletedProcess:
    """Run one `system.checks` derivation's builder script as Nix would ($out in a scratch dir)."""
    out = Path(tempfile.mkdtemp(prefix="dflash-check-")) / "out"
    try:
        return subprocess.run(["bash", "-e", "-c", check["script"]], capture_output=True, text=True,
                              env={**os.environ, "out": str(out)}, timeout=120)
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
