"""A model's small files where SGLang will load them from: config.json, tokenizer, weight sizes.

A model is a local directory or a hub repo id; a hub model is read from the cache the instance's
hub client uses (host/hub_cache.py), at the commit its revision resolves to there, and never from
the hub itself. Nothing here reads a weight file's contents: sizes come from the safetensors index,
the `models fetch` manifest or the files' sizes.
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl.host import hub_cache

# What transformers' tokenizer loading reads from a model directory; the first five define the
# vocabulary, the rest its settings (special tokens, chat template).
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                  "chat_template.json")
MAX_SMALL_FILE = 64 << 20  # a tokenizer.json is a few MiB; a config.json a few KiB


class ModelFileError(Exception):
    """A file SGLang would read is missing or unreadable (what, why)."""

    def __init__(self, what: str, why: str):
        super().__init__(what)
        self.what, self.why = what, why


@dataclass
class Located:
    model: str
    root: Path | None  # the directory SGLang will read; None: not on this host yet
    where: str  # for messages: "local directory X" or "hub cache X at commit C"
    cached: hub_cache.CachedModel | None = None  # hub models: what the cache holds
    manifest: Path | None = None  # hub models: the manifest `models fetch` wrote for the commit

    @property
    def is_local(self) -> bool:
        return self.cached is None


def locate(model: str, revision: str | None, env: dict[str, str]) -> Located:
    """Where SGLang, started with `env`, will read `model` from."""
    if hub_cache.is_local(model):
        root = Path(model).expanduser()
        return Located(model, root if root.is_dir() else None, f"local directory {root}")
    found = hub_cache.inspect(env, model, revision)
    hub = hub_cache.hub_dir(env)
    if found.commit is None:
        return Located(model, None, f"hub cache {hub} (revision {revision or 'main'} not fetched)", found)
    snapshot = hub / hub_cache.repo_folder(model) / "snapshots" / found.commit
    return Located(model, snapshot if snapshot.is_dir() else None,
                   f"hub cache {hub} at commit {found.commit}", found,
                   hub_cache.manifest_path(hub_cache.hf_home(env), model, found.commit))


def read_small(path: Path) -> bytes:
    try:
        size = path.stat().st_size  # follows the snapshot's link into blobs/
        if size > MAX_SMALL_FILE:
            raise ModelFileError(f"{path} is too large to be a {path.name}", f"{size} bytes")
        return path.read_bytes()
    except OSError as e:
        raise ModelFileError(f"cannot read {path}", e.strerror or str(e)) from None


def read_json(path: Path) -> dict:
    data = read_small(path)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFileError(f"{path} is not UTF-8 text", f"byte {e.start}: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path} is not valid JSON", f"line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ModelFileError(f"{path} is not valid JSON", "nested too deeply") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path} is not a JSON object", f"it holds a {type(value).__name__}")
    return value


def config(loc: Located) -> dict:
    """config.json of a located model; ModelFileError when it is not there or not a JSON object."""
    if loc.root is None:
        raise ModelFileError(f"{loc.model} is not on this host", loc.where)
    path = loc.root / "config.json"
    if not path.exists():
        raise ModelFileError(f"{loc.model} has no config.json", f"looked in {loc.where}")
    return read_json(path)


@dataclass
class Tokenizer:
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    root: Path | None = None

    @property
    def vocabulary_files(self) -> set[str]:
        return {f for f in self.files if f in VOCABULARY_FILES}

    def json(self, name: str) -> dict | None:
        return read_json(self.root / name) if self.root and name in self.files else None


def tokenizer(root: Path | None) -> Tokenizer:
    if root is None:
        return Tokenizer()
    files = {}
    for name in VOCABULARY_FILES + SETTINGS_FILES:
        path = root / name
        if path.exists():
            files[name] = hashlib.sha256(read_small(path)).hexdigest()
    return Tokenizer(files, root)


def vocabulary(tok: Tokenizer) -> dict[int, str] | None:
    """id -> token of a tokenizer.json (its model's vocab plus the added tokens), or None."""
    data = tok.json("tokenizer.json")
    if data is None:
        return None
    vocab = (data.get("model") or {}).get("vocab")
    out: dict[int, str] = {}
    if isinstance(vocab, dict):
        out.update({i: t for t, i in vocab.items() if isinstance(i, int)})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        out.update({i: p[0] for i, p in enumerate(vocab) if isinstance(p, list) and p})
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            out[added["id"]] = added.get("content")
    return out


def chat_template(tok: Tokenizer) -> str | None:
    """The chat template transformers would apply (chat_template.jinja wins over tokenizer_config)."""
    if tok.root and "chat_template.jinja" in tok.files:
        return read_small(tok.root / "chat_template.jinja").decode("utf-8", "replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        data = tok.json(name)
        value = data.get("chat_template") if data else None
        if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
            value = next((v.get("template") for v in value if isinstance(v, dict)
                          and v.get("name") == "default"), None)
        if isinstance(value, str):
            return value
    return None


@dataclass
class Weights:
    total_bytes: int | None  # None: unknown (nothing to read the size from)
    missing: list[str]  # weight files the index names that are not on disk
    how: str  # where the size came from


def weights(loc: Located) -> Weights:
    """The weights' size on disk and the files missing, read from the index or the files' sizes
    (for a hub model, missing is what host/hub_cache.py found: by the manifest's sizes if any)."""
    if loc.root is None:
        return Weights(None, [], "not on this host")
    try:
        found = _weights(loc)
    except OSError as e:  # an unreadable directory or shard: named, never a traceback
        raise ModelFileError(f"cannot read the weights in {loc.root}", e.strerror or str(e)) from None
    if loc.cached is not None:
        found.missing = list(loc.cached.missing)
    return found


def _weights(loc: Located) -> Weights:
    manifest_files = None
    if loc.manifest is not None and loc.manifest.exists():
        try:
            manifest_files = {f["path"]: f["size"] for f in json.loads(loc.manifest.read_text())["files"]}
        except (OSError, ValueError, KeyError, TypeError):
            manifest_files = None  # hub_cache.inspect names an unreadable manifest already
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (loc.root / index_name).exists():
            index = read_json(loc.root / index_name)
            shards = sorted({s for s in (index.get("weight_map") or {}).values() if isinstance(s, str)})
            missing = [s for s in shards if not (loc.root / s).exists()]
            total = (index.get("metadata") or {}).get("total_size")
            if isinstance(total, int) and total > 0:
                return Weights(total, missing, f"{index_name} (metadata.total_size)")
            if manifest_files is not None:
                return Weights(sum(manifest_files.get(s, 0) for s in shards), missing, "the fetch manifest")
            return Weights(sum((loc.root / s).stat().st_size for s in shards if s not in missing) or None,
                           missing, "the shards' sizes")
    files = [p for p in loc.root.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    present = [p for p in files if p.exists()]  # exists() follows links: a link whose blob is gone
    if manifest_files is not None:
        total = sum(s for n, s in manifest_files.items() if Path(n).suffix in (".safetensors", ".bin", ".pt"))
        return Weights(total or None, [p.name for p in files if not p.exists()], "the fetch manifest")
    if not present:
        return Weights(None, ["*.safetensors (no weight files)"], "no weight files")
    return Weights(sum(p.stat().st_size for p in present), [p.name for p in files if not p.exists()],
                   "the files' sizes")
