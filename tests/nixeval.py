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


def eval_expr(nix: str, expr: str):
    """`nix eval --json --impure --expr EXPR`, parsed; a failed evaluation fails the test with nix's
    message."""
    done = subprocess.run([nix, "eval", "--json", "--impure", "--expr", expr], capture_output=True,
                          text=True, env=nix_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def unit_sections(nix: str, expr: str) -> dict[str, dict[str, list[str]]]:
    """A unit's directives as Nix gives them ({section: {key: value or list}}), evaluated and
    turned into the lines systemd reads: each value a list of strings, booleans as true/false."""
    def lines(v):
        v = v if isinstance(v, list) else [v]
        return ["true" if x is True else "false" if x is False else str(x) for x in v]
    return {sec: {k: lines(v) for k, v in d.items()} for sec, d in eval_expr(nix, expr).items()}
