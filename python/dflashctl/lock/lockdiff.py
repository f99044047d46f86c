"""What changed between two locks, per system and package; shared by `lock --diff` and `--check`."""

from dataclasses import asdict, dataclass

from packaging.version import InvalidVersion, Version

from dflashctl.lock.lockfile import Lock

# Change kinds, in the order a reader cares about them.
KINDS = ("re-hashed", "added", "removed", "upgraded", "downgraded", "re-wheeled", "deps", "setting")


@dataclass(frozen=True)
class Change:
    system: str  # "*" for lock-wide settings
    package: str
    kind: str
    old: str
    new: str


def _direction(old: str, new: str) -> str:
    try:
        return "upgraded" if Version(new) > Version(old) else "downgraded"
    except InvalidVersion:
        return "upgraded"


def diff(old: Lock, new: Lock) -> list[Change]:
    out = []
    for key in ("python", "exclude_newer", "requirements", "spec_sha256"):
        a, b = getattr(old, key), getattr(new, key)
        if a != b:
            out.append(Change("*", key, "setting", str(a), str(b)))
    for system in sorted(set(old.systems) | set(new.systems)):
        a, b = old.systems.get(system, {}), new.systems.get(system, {})
        if sorted(old.roots.get(system, [])) != sorted(new.roots.get(system, [])):
            out.append(Change(system, "roots", "setting", " ".join(sorted(old.roots.get(system, []))),
                              " ".join(sorted(new.roots.get(system, [])))))
        for name in sorted(set(a) | set(b)):
            x, y = a.get(name), b.get(name)
            if x is None:
                out.append(Change(system, name, "added", "", f"{y.version} {y.file}"))
            elif y is None:
                out.append(Change(system, name, "removed", f"{x.version} {x.file}", ""))
            elif x.version != y.version:
                out.append(Change(system, name, _direction(x.version, y.version), x.version, y.version))
            elif x.file != y.file:
                out.append(Change(system, name, "re-wheeled", x.file, y.file))
            elif (x.sha256, x.size) != (y.sha256, y.size):
                out.append(Change(system, name, "re-hashed", f"{x.sha256[:16]}… {x.size} B",
                                  f"{y.sha256[:16]}… {y.size} B"))
            elif sorted(x.dependencies) != sorted(y.dependencies):
                out.append(Change(system, name, "deps", " ".join(sorted(x.dependencies)),
                                  " ".join(sorted(y.dependencies))))
    return sorted(out, key=lambda c: (KINDS.index(c.kind), c.system, c.package))


def table(changes: list[Change]) -> str:
    if not changes:
        return "no changes"
    rows = [("SYSTEM", "PACKAGE", "CHANGE", "OLD", "NEW")]
    rows += [(c.system, c.package, c.kind, c.old or "-", c.new or "-") for c in changes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths)) + "  " + r[4]
                     for r in rows)


def as_json(changes: list[Change]) -> list[dict]:
    return [asdict(c) for c in changes]
