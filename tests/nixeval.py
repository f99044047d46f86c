"""Run `nix eval` the way tests/run configures Nix (offline, flakes on, no sandbox)."""

import json
import os
import subprocess
from pathlib import Path

NIX_CONFIG = "experimental-features = nix-command flakes\nsandbox = false\nsubstituters =\nwarn-dirty = false"


def nix_env() -> dict:
    return {**os.environ, "NIX_CONFIG": NIX_CONFIG}


def eval_file(nix: str, path: Path, args: str = "{ }") -> subprocess.CompletedProcess:
    """`nix eval --json --file PATH`; a file that is a function is called with `args` (Nix 2.8's
    `nix eval` does not auto-call, and --impure only lets --expr read the file)."""
    expr = f"let f = import {Path(path).resolve()}; in if builtins.isFunction f then f ({args}) else f"
    return subprocess.run([nix, "eval", "--json", "--impure", "--expr", expr], capture_output=True,
                          text=True, env=nix_env(), timeout=120)


def eval_json(nix: str, path: Path):
    done = eval_file(nix, path)
    assert done.returncode == 0, f"nix eval --file {path} failed:\n{done.stderr}"
    return json.loads(done.stdout)


def nixpkgs_lib() -> Path | None:
    """A nixpkgs lib outside the repository: $DFLASH_NIXPKGS_LIB (e.g. a nix-community/nixpkgs.lib
    checkout) or $DFLASH_NIXPKGS (a nixpkgs checkout), each holding lib/default.nix; else None."""
    for root in (os.environ.get("DFLASH_NIXPKGS_LIB"), os.environ.get("DFLASH_NIXPKGS")):
        if root and (Path(root) / "lib" / "default.nix").exists():
            return Path(root) / "lib"
    return None
