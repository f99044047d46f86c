"""uv.lock (universal, all systems) → one system's closure: which packages, which wheel each.

Walks from the spec's requirements, evaluating every dependency marker for the system and
following extras through `optional-dependencies` (torch needs cuda-toolkit[cublas,...]).
"""

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import unquote

from packaging.markers import Marker

from dflashctl.lock.lockfile import LockedWheel, canonical_name
from dflashctl.lock.spec import Spec
from dflashctl.lock.wheels import best_wheel, marker_env, tag_priority


@dataclass
class Closure:
    packages: dict[str, LockedWheel]  # canonical name -> chosen wheel
    urls: dict[str, str]  # canonical name -> download URL (memory only, never written)
    roots: list[str]
    problems: list[str]  # contract-level faults found while walking (no wheel, two versions)
    dev_roots: list[str] = field(default_factory=list)  # the spec's dev group


def file_name(url: str) -> str:
    return unquote(url.rsplit("/", 1)[-1])


@lru_cache(maxsize=None)
def _marker(text: str) -> Marker:
    return Marker(text)  # parsing dominates the walk; the same few markers repeat


def _applies(marker: str | None, env: dict) -> bool:
    return marker is None or _marker(marker).evaluate(env)


def _find(index: dict, dep: dict, env: dict) -> dict | None:
    """The uv.lock package a dependency entry points at (uv forks a name into versions by marker)."""
    candidates = index.get(canonical_name(dep["name"]), [])
    if "version" in dep:
        candidates = [p for p in candidates if p["version"] == dep["version"]]
    if len(candidates) > 1:
        candidates = [p for p in candidates
                      if any(_applies(m, env) for m in p.get("resolution-markers", [None]))]
    return candidates[0] if candidates else None


def closure(uv_lock: dict, spec: Spec, system: str) -> Closure:
    env = marker_env(system, spec.python)
    project, index = _split_lock(uv_lock)
    walk = _Walk(index, env, system)
    roots = walk.from_roots(project.get("dependencies", []), "the spec")
    runtime = set(walk.reached)
    # The dev group is walked after the stack: what only it reaches is marked dev.
    dev_roots = walk.from_roots(project.get("dev-dependencies", {}).get("dev", []), "the spec's dev group")
    problems = walk.problems + _version_problems(walk.reached, system)
    packages, urls = _choose_wheels(walk, runtime, spec, system, problems)
    return Closure(packages, urls, sorted(r for r in roots if r), problems,
                   sorted(r for r in dev_roots if r))


def _split_lock(uv_lock: dict) -> tuple[dict, dict[str, list[dict]]]:
    """The project's own entry (virtual or editable) and every other package by canonical name."""
    index: dict[str, list[dict]] = {}
    project = None
    for p in uv_lock.get("package", []):
        if "virtual" in p.get("source", {}) or "editable" in p.get("source", {}):
            project = p
        else:
            index.setdefault(canonical_name(p["name"]), []).append(p)
    return project or {}, index


class _Walk:
    """Breadth-first over uv's lock from some roots, for one system's markers: what is reached
    (with the extras asked of it), each package's edges, and what could not be found."""

    def __init__(self, index: dict[str, list[dict]], env: dict, system: str):
        self.index, self.env, self.system = index, env, system
        self.reached: dict[tuple[str, str], dict] = {}  # (name, version) -> package
        self.extras: dict[tuple[str, str], set[str]] = {}
        self.deps: dict[tuple[str, str], set[str]] = {}
        self.queue: deque[tuple[dict, frozenset[str]]] = deque()
        self.problems: list[str] = []

    def from_roots(self, dependencies: list[dict], who: str) -> list[str | None]:
        roots = [self.visit(dep, who) for dep in dependencies if _applies(dep.get("marker"), self.env)]
        while self.queue:
            self.step()
        return roots

    def visit(self, dep: dict, from_name: str) -> str | None:
        target = _find(self.index, dep, self.env)
        if target is None:
            self.problems.append(f"{from_name} needs {dep['name']} on {self.system}, but uv's lock has no "
                                 f"matching entry")
            return None
        self.queue.append((target, frozenset(dep.get("extra", []))))
        return canonical_name(target["name"])

    def step(self) -> None:
        pkg, wanted = self.queue.popleft()
        key = (canonical_name(pkg["name"]), pkg["version"])
        new_extras = wanted - self.extras.get(key, set())
        if key in self.reached and not new_extras:
            return
        first = key not in self.reached
        self.reached[key] = pkg
        self.extras.setdefault(key, set()).update(wanted)
        edges = list(pkg.get("dependencies", [])) if first else []
        for extra in sorted(new_extras):
            edges += pkg.get("optional-dependencies", {}).get(extra, [])
        for dep in edges:
            if _applies(dep.get("marker"), self.env):
                name = self.visit(dep, key[0])
                if name:
                    self.deps.setdefault(key, set()).add(name)


def _version_problems(reached: dict[tuple[str, str], dict], system: str) -> list[str]:
    versions: dict[str, list[str]] = {}
    for name, version in reached:
        versions.setdefault(name, []).append(version)
    return [f"{name}: one version per system expected on {system}, found {', '.join(sorted(vs))}"
            for name, vs in sorted(versions.items()) if len(vs) > 1]


def _choose_wheels(walk: _Walk, runtime: set, spec: Spec, system: str,
                   problems: list[str]) -> tuple[dict, dict]:
    """The best wheel of every reached package for `system` (a problem where none fits)."""
    priority = tag_priority(system, spec.python, spec.manylinux)
    packages, urls = {}, {}
    for (name, version), pkg in sorted(walk.reached.items()):
        wheels = {file_name(w["url"]): w for w in pkg.get("wheels", [])}
        chosen = best_wheel(list(wheels), priority)
        if chosen is None:
            offered = ", ".join(sorted(wheels)) or ("only an sdist" if "sdist" in pkg else "nothing")
            problems.append(f"{name} {version}: a wheel for {system} (cp{spec.python.replace('.', '')}, "
                            f"manylinux <= {'_'.join(map(str, spec.manylinux))}) expected, found "
                            f"{offered}")
            continue
        w = wheels[chosen]
        packages[name] = LockedWheel(name, version, chosen, int(w["size"]),
                                     w["hash"].removeprefix("sha256:"),
                                     tuple(sorted(walk.deps.get((name, version), ()))),
                                     dev=(name, version) not in runtime)
        urls[name] = w["url"]
    return packages, urls
