"""The published model pairs' config.json files (tests/data/models, named as the hub names them), a
tokenizer.json of our own, and the pair laid out in a hub cache (`cached_pair`) with the instance
settings that read it offline (`hub_settings`). Used by test_model_pair and
benchmarks/model_pair_bench.py."""

import json
from pathlib import Path

from hub_cache_layout import COMMIT, DRAFT_COMMIT, lay_out

DATA = Path(__file__).parent / "data" / "models"
QWEN, QWEN_DRAFT = "qwen3-8b", "qwen3-8b-dflash-b16"
LLAMA, LLAMA_DRAFT = "llama-3.1-8b-instruct", "llama3.1-8b-instruct-dflash-ultrachat"


def tokenizer_json(tokens: list[str], added: tuple[str, ...] = ()) -> str:
    """A small tokenizer.json of our own: a BPE vocabulary and added special tokens."""
    return json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                                                   "merges": []},
                       "added_tokens": [{"id": len(tokens) + k, "content": a, "special": True}
                                        for k, a in enumerate(added)]})


VOCAB = [f"tok{i}" for i in range(64)]


def cached_pair(home: Path, draft: str = QWEN_DRAFT, manifest: bool = True):
    files = lambda name, tok: {  # noqa: E731
        "config.json": (DATA / name / "config.json").read_bytes(),
        **({"tokenizer.json": tokenizer_json(VOCAB).encode()} if tok else {}),
        "model.safetensors": b"\0" * 128}
    lay_out(home, "Qwen/Qwen3-8B", COMMIT, files(QWEN, True), manifest=manifest)
    lay_out(home, "z-lab/draft", DRAFT_COMMIT, files(draft, False), manifest=manifest)


def hub_settings(home: Path, **more) -> dict:
    return {"name": "q", "model": "Qwen/Qwen3-8B", "modelRevision": COMMIT, "draftModel": "z-lab/draft",
            "draftModelRevision": DRAFT_COMMIT, "speculative": {"algorithm": "DFLASH"}, "offline": True,
            "cacheDir": str(home), **more}
