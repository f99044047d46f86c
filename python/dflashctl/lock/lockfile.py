"""The lock file `nix/python-lock.json`: the one model of it that every command reads.

Schema (version 1), keys sorted, written by `dflashctl lock`, read by Nix (`nix/lib/lock.nix`):

    {
      "version": 1,
      "spec_sha256": "<sha256 of nix/stack.toml's bytes>",
      "python": "3.12",
      "exclude_newer": "2026-...Z",
      "requirements": ["sglang==0.5.11", ...],          # top-level pins from the spec
      "systems": {
        "x86_64-linux": {
          "roots": ["flashinfer-cubin", "sglang", ...],   # canonical names of the requirements
          "packages": {
            "torch": {
              "version": "2.11.0",
              "file": "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
              "size": 530712279,
              "sha256": "<64 hex>",
              "dependencies": ["cuda-bindings", ...],     # canonical names, markers evaluated
              "license": "BSD-3-Clause"                   # SPDX expression from the wheel's metadata
            },                                            #   (lock/licenses.py); Nix maps it to meta.license
            "pytest": {..., "dev": true}                  # reached only from the dev group
          },
          "dev_roots": ["pytest"]                         # canonical names of [dependency-groups] dev
        }
      }
    }

No URLs: Nix derives the download from the file name (fetchPypi), pip finds files by name and hash.
"""

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl import inputs, output
from dflashctl.errors import INPUT, DflashError

LOCK_VERSION = 1
DEFAULT_LOCK = Path("nix/python-lock.json")
DEFAULT_SPEC = Path("nix/stack.toml")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: 'Sglang_Kernel' -> 'sglang-kernel'."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    file: str
    size: int
    sha256: str
    dependencies: tuple[str, ...] = field(default_factory=tuple)
    license: str = ""  # SPDX expression (LicenseRef-... where the metadata names none)
    dev: bool = False  # in the dev shell only: not in dflash-env, not exported


@dataclass
class Lock:
    spec_sha256: str
    python: str
    exclude_newer: str
    requirements: list[str]
    systems: dict[str, dict[str, LockedWheel]]  # system -> canonical name -> wheel
    roots: dict[str, list[str]]  # system -> top-level canonical names
    dev_roots: dict[str, list[str]] = field(default_factory=dict)  # system -> the dev group's names

    def packages(self, system: str, dev: bool = False) -> dict[str, LockedWheel]:
        """One system's stack (what dflash-env holds); with `dev`, the dev shell's set too."""
        if system not in self.systems:
            raise DflashError(
                f"the lock has no entry for system {system!r}",
                f"it covers {', '.join(sorted(self.systems)) or 'no system'}",
                "add the system to `systems` in nix/stack.toml and run `dflashctl lock`", INPUT,
            )
        return {n: w for n, w in self.systems[system].items() if dev or not w.dev}

    def missing_dependencies(self, system: str) -> dict[str, list[str]]:
        """Packages a locked one depends on (or a root) that the system's set lacks: name -> needed by.
        A lock edited by hand can drop one; pip's --no-deps would then install the rest without it."""
        pkgs = self.systems.get(system, {})
        missing: dict[str, list[str]] = {}
        for name, w in sorted(pkgs.items()):
            for dep in w.dependencies:
                if dep not in pkgs:
                    missing.setdefault(dep, []).append(name)
        for root in self.roots.get(system, []) + self.dev_roots.get(system, []):
            if root not in pkgs:
                missing.setdefault(root, []).append("the spec's requirements")
        return missing

    def to_json(self) -> dict:
        return {
            "version": LOCK_VERSION,
            "spec_sha256": self.spec_sha256,
            "python": self.python,
            "exclude_newer": self.exclude_newer,
            "requirements": list(self.requirements),
            "systems": {
                system: {
                    "roots": sorted(self.roots.get(system, [])),
                    "dev_roots": sorted(self.dev_roots.get(system, [])),
                    "packages": {
                        name: {
                            "version": w.version,
                            "file": w.file,
                            "size": w.size,
                            "sha256": w.sha256,
                            "dependencies": sorted(w.dependencies),
                            "license": w.license,
                            **({"dev": True} if w.dev else {}),
                        }
                        for name, w in sorted(pkgs.items())
                    },
                }
                for system, pkgs in sorted(self.systems.items())
            },
        }

    def dumps(self) -> str:
        """The canonical text: byte-identical for the same content."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


def parse(data: dict, origin: str = "lock") -> Lock:
    """Build a Lock from its JSON form, refusing anything malformed with the offending key."""

    def bad(why: str) -> DflashError:
        return DflashError(f"{origin} is not a valid dflashctl lock", why,
                           "regenerate it with `dflashctl lock`", INPUT)

    if not isinstance(data, dict) or data.get("version") != LOCK_VERSION:
        raise bad(f"expected an object with \"version\": {LOCK_VERSION}")
    try:
        systems, roots, dev_roots = {}, {}, {}
        for system, body in data["systems"].items():
            pkgs = {}
            for name, p in body["packages"].items():
                if not _SHA256.match(p["sha256"]):
                    raise bad(f"{system}/{name}: sha256 {p['sha256']!r} is not 64 hex digits")
                if not p["file"].endswith(".whl"):
                    raise bad(f"{system}/{name}: {p['file']} is not a wheel")
                pkgs[name] = LockedWheel(name, p["version"], p["file"], int(p["size"]), p["sha256"],
                                         tuple(p["dependencies"]), str(p.get("license", "")),
                                         bool(p.get("dev", False)))
            systems[system] = pkgs
            roots[system] = list(body.get("roots", []))
            dev_roots[system] = list(body.get("dev_roots", []))
        return Lock(data["spec_sha256"], data["python"], data["exclude_newer"],
                    list(data["requirements"]), systems, roots, dev_roots)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise bad(f"missing or mistyped field {e}") from None


def load(path: Path | str = DEFAULT_LOCK) -> Lock:
    path = Path(path)
    if not os.path.lexists(path):
        raise DflashError(f"no lock at {path}", "the file does not exist",
                          "run `dflashctl lock` in the repository root, or pass --lock PATH", INPUT)
    data = inputs.read_json(path, "lock", "regenerate it with `dflashctl lock`, or pass --lock PATH", INPUT,
                            MAX_LOCK)
    return parse(data, str(path))


MAX_LOCK = 64 << 20  # the real lock is ~140 KiB


def write_atomic(path: Path | str, text: str, flag: str) -> None:
    """Whole or not at all (output.write: a temp file in the same directory, renamed)."""
    output.write(path, text, flag)
