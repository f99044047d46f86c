"""README.md's pin table, generated from nix/stack.toml (the pins) and nix/python-lock.json (what
they resolved to: the wheel counts).

`python -m dflashctl.lock.pin_table README.md` rewrites it between its markers (tests/regenerate
runs it; tests/lock/test_pin_table.py fails while it is stale), so the table shows the pins the
spec holds and nothing else. Every `==` requirement is a row; torch's row names the CUDA line the
contract holds it to.
"""

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

from dflashctl.errors import DflashError
from dflashctl.lock import lockfile, spec as specmod

START = ("<!-- pin table: generated from nix/stack.toml and nix/python-lock.json by `tests/regenerate`; "
         "edit the spec, not the table -->")
END = "<!-- end of the generated pin table -->"
NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?)")  # the name with its extras, as written


def pins(spec: specmod.Spec) -> list[tuple[str, str]]:
    """(name as written, version) of each requirement pinned with `==`, in the spec's order."""
    out = []
    for text in spec.requirements:
        exact = [s.version for s in Requirement(text).specifier if s.operator == "=="]
        if exact:
            out.append((NAME.match(text)[1], exact[0]))
    return out


def table(spec: specmod.Spec, lock: lockfile.Lock) -> str:
    rows = ["| pinned | version |", "|---|---|"]
    for name, version in pins(spec):
        cuda = spec.contract.cuda and lockfile.canonical_name(Requirement(name).name) == "torch"
        rows.append(f"| {name} | {version}{f', CUDA {spec.contract.cuda} build' if cuda else ''} |")
    floor = f"manylinux_{spec.manylinux[0]}_{spec.manylinux[1]}"
    rows.append(f"| Python | {spec.python}, wheels for {', '.join(spec.systems)} up to {floor} |")
    counts = ", ".join(f"{len(lock.packages(s))} wheels for {s}" for s in spec.systems if s in lock.systems)
    dev = sorted({n for names in lock.dev_roots.values() for n in names})
    group = f", plus the dev shell's {', '.join(dev)} group" if dev else ""
    return "\n".join(rows) + (
        f"\n\nPins live in `nix/stack.toml` only; `nix/python-lock.json` is generated from it ({counts}{group}; "
        f"each with file name, size, sha256 and licence; no URLs), from what the index held before "
        f"{spec.exclude_newer}.")


def with_table(text: str, spec: specmod.Spec, lock: lockfile.Lock) -> str:
    a, b = text.index(START), text.index(END)
    return text[:a] + START + "\n" + table(spec, lock) + "\n" + text[b:]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dflashctl.lock.pin_table README.md (run in the repository root)", file=sys.stderr)
        return 2
    path = Path(argv[0])
    text = path.read_text()
    if START not in text or END not in text:
        print(f"{path} has no generated pin table: put these two lines where it goes, then run this again:\n"
              f"{START}\n{END}", file=sys.stderr)
        return 1
    root = path.resolve().parent
    try:
        spec = specmod.load(root / lockfile.DEFAULT_SPEC)
        lock = lockfile.load(root / lockfile.DEFAULT_LOCK)
    except DflashError as e:  # said as the CLI says it, not as a traceback
        print(f"pin table not written: {e}", file=sys.stderr)
        return 1
    path.write_text(with_table(text, spec, lock))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
