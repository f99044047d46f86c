"""A model cache laid out as huggingface_hub lays it out (`lay_out`), and the two revisions the
model tests pin (COMMIT for the target, DRAFT_COMMIT for the drafter)."""

import hashlib
import json
import os
from pathlib import Path

from dflashctl.host import hub_cache

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
DRAFT_COMMIT = "3b1c0d2e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c"


def lay_out(hf_home: Path, repo_id: str, commit: str, files: dict[str, bytes], ref: str | None = "main",
            manifest: bool = False) -> Path:
    """A cache in huggingface_hub's layout: blobs by etag, snapshot links, refs/<branch>."""
    root = hf_home / "hub" / hub_cache.repo_folder(repo_id)
    snapshot = root / "snapshots" / commit
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    if manifest:
        m = hub_cache.manifest_path(hf_home, repo_id, commit)
        m.parent.mkdir(parents=True, exist_ok=True)
        m.write_text(json.dumps({"files": [{"path": n, "size": len(d)} for n, d in files.items()]}))
    return snapshot
