"""Run `nix eval` the way tests/run configures Nix (offline, flakes on, no sandbox)."""

import json
import os
import subprocess
from pathlib import Path

NIX_CONFIG = "experimental-features = nix-command flakes\nsandbox = false\nsubstituters =\nwarn-dirty = false"


def nix_env() -> dict:
    return {**os.environ, "NIX_CONFIG": NIX_CONFIG}


def eval_file(nix: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([nix, "eval", "--json", "--file", str(path)], capture_output=True,
                          text=True, env=nix_env(), timeout=120)


def eval_json(nix: str, path: Path):
    done = eval_file(nix, path)
    assert done.returncode == 0, f"nix eval --file {path} failed:\n{done.stderr}"
    return json.loads(done.stdout)
