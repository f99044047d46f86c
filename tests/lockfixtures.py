"""Shared loaders for the lock tests: the captured small real stack in tests/data/lock/."""

import copy
import json
import tomllib
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "lock"


def spec():
    from dflashctl.lock import spec as specmod
    return specmod.load(DATA / "stack.toml")


def uv_lock() -> dict:
    return copy.deepcopy(_UV)


def torch_requires() -> dict[str, list[str]]:
    return json.loads((DATA / "torch-requires.json").read_text())


def package(uv: dict, name: str) -> dict:
    return next(p for p in uv["package"] if p["name"] == name)


def metadata_text(file: str) -> str:
    """The captured licence headers of one wheel's METADATA, as METADATA text."""
    headers = _METADATA[file]
    return "".join(f"{key}: {value}\n" for key, values in headers.items() for value in values)


def captured_licenses(urls: dict[str, str]) -> dict[str, str]:
    from dflashctl.lock.licenses import license_of
    return {f: license_of(metadata_text(f)) for f in urls}


def build(uv=None, sp=None, requires=None):
    from dflashctl.lock.lock import lock_from_uv
    requires = torch_requires() if requires is None else requires
    return lock_from_uv(uv_lock() if uv is None else uv, sp or spec(), lambda s, url: requires[s],
                        captured_licenses)


_UV = tomllib.loads((DATA / "uv.lock").read_text())
_METADATA = json.loads((DATA / "metadata.json").read_text())
