"""`nix/stack.toml`: the human-edited pins that `dflashctl lock` turns into the lock."""

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from dflashctl import inputs
from dflashctl.errors import INPUT, DflashError
from dflashctl.lock.lockfile import canonical_name
from dflashctl.systems import SYSTEMS


@dataclass(frozen=True)
class Contract:
    """ABI rules every lock must satisfy (see contract.py); a missing key switches its rule off."""

    torch: str | None = None
    cuda: str | None = None  # toolkit line torch must require, e.g. "13.0"
    sglang_kernel: str | None = None
    xgrammar: str | None = None
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    python: str
    systems: tuple[str, ...]
    manylinux: tuple[int, int]  # newest glibc tag accepted, e.g. (2, 34)
    exclude_newer: str
    requirements: tuple[str, ...]
    contract: Contract = field(default_factory=Contract)
    sha256: str = ""  # of the file's bytes; Nix checks it with builtins.hashFile
    # [dependency-groups] dev: the dev shell's tools (pytest), resolved with the stack so they
    # share its versions, kept out of dflash-env and `dflashctl export`.
    dev_requirements: tuple[str, ...] = ()

    def roots(self, marker_env: dict) -> list[str]:
        """Canonical names of the requirements that apply under `marker_env`."""
        reqs = (Requirement(r) for r in self.requirements)
        return sorted({canonical_name(r.name) for r in reqs
                       if r.marker is None or r.marker.evaluate(marker_env)})


def _bad(path, why: str) -> DflashError:
    return DflashError(f"{path} is not a valid stack spec", why,
                       "fix the file (its comments describe each key) and run `dflashctl lock` again", INPUT)


def parse(data: bytes, path="stack.toml") -> Spec:
    try:
        doc = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _bad(path, f"TOML error: {e}") from None

    def need(key, kind, where=doc, prefix=""):
        if key not in where:
            raise _bad(path, f"missing key `{prefix}{key}`")
        if not isinstance(where[key], kind):
            raise _bad(path, f"`{prefix}{key}` must be a {getattr(kind, '__name__', 'value')}")
        return where[key]

    python = need("python", str)
    if not re.fullmatch(r"3\.\d+", python):
        raise _bad(path, f"`python` must look like \"3.12\", not {python!r}")
    systems = need("systems", list)
    for s in systems:
        if s not in SYSTEMS:
            raise _bad(path, f"unknown system {s!r} in `systems`; known: {', '.join(SYSTEMS)}")
    if not systems or len(set(systems)) != len(systems):
        raise _bad(path, "`systems` must list at least one system, each once")
    m = re.fullmatch(r"(\d+)_(\d+)", need("manylinux", str))
    if not m:
        raise _bad(path, f"`manylinux` must look like \"2_34\", not {doc['manylinux']!r}")
    exclude_newer = need("exclude-newer", str)
    try:
        if not exclude_newer.endswith("Z"):
            raise ValueError
        datetime.fromisoformat(exclude_newer[:-1])
    except ValueError:
        raise _bad(path, f"`exclude-newer` must be a UTC time like \"2026-05-08T00:00:00Z\", "
                         f"not {exclude_newer!r}") from None
    requirements = need("requirements", list)
    groups = doc.get("dependency-groups", {})
    if not isinstance(groups, dict) or set(groups) - {"dev"}:
        raise _bad(path, "`dependency-groups` must be a table with one key, `dev`")
    dev_requirements = need("dev", list, groups, "dependency-groups.") if "dev" in groups else []
    for key, reqs in (("requirements", requirements), ("dependency-groups.dev", dev_requirements)):
        names = set()
        for r in reqs:
            try:
                name = canonical_name(Requirement(r).name)
            except (InvalidRequirement, TypeError) as e:
                raise _bad(path, f"requirement {r!r} is not PEP 508: {e}") from None
            if name in names:
                raise _bad(path, f"{name} is listed twice in `{key}`")
            names.add(name)
    c = doc.get("contract", {})
    if not isinstance(c, dict):
        raise _bad(path, "`contract` must be a table")
    unknown = set(c) - {"torch", "cuda", "sglang-kernel", "xgrammar", "required"}
    if unknown:
        raise _bad(path, f"unknown key(s) in [contract]: {', '.join(sorted(unknown))}")
    for key in ("torch", "cuda", "sglang-kernel", "xgrammar"):
        if key in c:
            need(key, str, c, "contract.")
    contract = Contract(c.get("torch"), c.get("cuda"), c.get("sglang-kernel"), c.get("xgrammar"),
                        tuple(canonical_name(n) for n in need("required", list, c, "contract."))
                        if "required" in c else ())
    return Spec(python, tuple(systems), (int(m[1]), int(m[2])), exclude_newer, tuple(requirements),
                contract, hashlib.sha256(data).hexdigest(), tuple(dev_requirements))


def load(path: Path | str) -> Spec:
    path = Path(path)
    if not os.path.lexists(path):
        raise DflashError(f"no stack spec at {path}", "the file does not exist",
                          "run in the repository root (the checkout holding nix/stack.toml; an installed "
                          "dflashctl carries the lock, not the spec), or pass --spec PATH", INPUT)
    return parse(inputs.read_bytes(path, "stack spec", "pass --spec the repository's nix/stack.toml", INPUT,
                                   1 << 20), path)
