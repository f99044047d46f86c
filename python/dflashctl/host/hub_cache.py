"""What a host's model cache holds, read as the hub client lays it out (no hub, no network).

Layout (huggingface_hub): `<HF_HOME>/hub/models--<org>--<name>/` with `refs/<branch>` (a file
holding the commit), `snapshots/<commit>/<file>` (links into `blobs/`) and `blobs/<etag>`.
`dflashctl models fetch` adds a manifest per fetched commit, `<HF_HOME>/dflash-manifests/
models--<org>--<name>/<commit>.json` (every file with its size and hash), so completeness can be
checked by size in milliseconds; without one, a snapshot is judged by its config and weight index.
"""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflashctl.host import probes

COMMIT_RE = re.compile(r"[0-9a-f]{40}")
MANIFESTS = "dflash-manifests"


def hf_home(env: dict[str, str]) -> Path:
    """HF_HOME as the hub client derives it from an environment."""
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"])
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~"), ".cache"))
    return Path(xdg, "huggingface").expanduser()


def hub_dir(env: dict[str, str]) -> Path:
    return Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else hf_home(env) / "hub"


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def manifest_path(home: Path, repo_id: str, commit: str) -> Path:
    return home / MANIFESTS / repo_folder(repo_id) / f"{commit}.json"


@dataclass
class CachedModel:
    repo_id: str
    revision: str | None  # as asked for (None: the hub's main)
    commit: str | None = None  # what the revision resolves to in this cache
    missing: list[str] = field(default_factory=list)
    checked_by: str = "none"  # "manifest", "index" (config + weight index), or "none" (not cached)

    @property
    def complete(self) -> bool:
        return self.commit is not None and not self.missing

    def to_json(self) -> dict:
        return {**asdict(self), "complete": self.complete}


def resolve_commit(hub: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit a revision points to in this cache (refs/<branch>), or the commit itself."""
    rev = revision or "main"
    if COMMIT_RE.fullmatch(rev):
        return rev
    ref = hub / repo_folder(repo_id) / "refs" / rev
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if COMMIT_RE.fullmatch(commit) else None


def inspect(env: dict[str, str], repo_id: str, revision: str | None) -> CachedModel:
    """Is `repo_id` at `revision` fully in the cache that `env` points the hub client at?"""
    home, hub = hf_home(env), hub_dir(env)
    found = CachedModel(repo_id, revision)
    found.commit = resolve_commit(hub, repo_id, revision)
    if found.commit is None:
        found.missing = [f"refs/{revision or 'main'} (the revision was never fetched)"]
        return found
    snapshot = hub / repo_folder(repo_id) / "snapshots" / found.commit
    manifest = manifest_path(home, repo_id, found.commit)
    if manifest.exists():
        found.checked_by = "manifest"
        try:
            files = json.loads(manifest.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            found.missing = [f"{manifest} is unreadable; fetch again"]
            return found
        for f in files:
            path = snapshot / f["path"]
            try:
                ok = path.stat().st_size == f["size"]  # follows the link into blobs/
            except OSError:
                ok = False
            if not ok:
                found.missing.append(f["path"])
        return found
    if not snapshot.is_dir():
        found.missing = [f"snapshots/{found.commit}/ (the revision was never fetched)"]
        return found
    found.checked_by = "index"
    found.missing = _missing_by_index(snapshot)
    return found


def _missing_by_index(snapshot: Path) -> list[str]:
    """Without a manifest: config.json and every weight file the index names must be readable."""
    missing = [] if (snapshot / "config.json").exists() else ["config.json"]
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = snapshot / index_name
        if index.exists():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError):
                return missing + [f"{index_name} (unreadable)"]
            return missing + [s for s in shards if not (snapshot / s).exists()]
    weights = [p for p in snapshot.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    if not any(p.exists() for p in weights):  # exists() is false for a link whose blob is gone
        missing.append("*.safetensors (no weights)")
    return missing


def is_local(model: str) -> bool:
    """A directory on the host rather than a hub repo id (`org/name`)."""
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def check(found: dict):
    """doctor's row for one model: ok when the revision is whole in the cache."""
    name = f"model {found['repo_id']}"
    if found["complete"]:
        return probes.ok(name, f"{found['revision'] or 'main'} -> commit {found['commit']}, complete "
                               f"(checked by {found['checked_by']})")
    return probes.warn(name, f"{found['revision'] or 'main'}: not complete in the cache: "
                             + ", ".join(found["missing"][:4]),
                       "dflashctl models fetch --config <the instance's settings> (or let the service "
                       "download it at its first start, if it is not offline)")
