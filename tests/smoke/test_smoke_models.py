"""Issue 12 in smoke: a real pair's result names the commits the servers loaded, so two hosts'
results show whether they served the same weights (`dflashctl diff A.json B.json`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hub_cache_layout import COMMIT, DRAFT_COMMIT, lay_out
from lossless_load import LOAD, real_pair_args
from smoke_runner import smoke

from dflashctl import errors

MODELS = Path(__file__).parent.parent / "data" / "models"  # the published configs (the model-pair check reads them)
TARGET_FILES = {"config.json": (MODELS / "qwen3-8b" / "config.json").read_bytes(),
                "tokenizer.json": b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}',
                "model.safetensors": b"w" * 64}
DRAFT_FILES = {"config.json": (MODELS / "qwen3-8b-dflash-b16" / "config.json").read_bytes(),
               "model.safetensors": b"w" * 64}


def run(tmp_path, name: str, target_commit: str):
    home = tmp_path / f"hf-{name}"
    lay_out(home, "Qwen/Qwen3-8B", target_commit, TARGET_FILES)
    lay_out(home, "z-lab/Qwen3-8B-DFlash-b16", DRAFT_COMMIT, DRAFT_FILES, ref="v1")
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", f"{name}.json", *real_pair_args(),
              "--model-revision", "main", "--draft-model-revision", "v1", "--keep-logs", f"logs-{name}",
              HF_HOME=str(home))
    assert p.returncode == 0, p.stderr
    return p, json.loads((tmp_path / f"{name}.json").read_text())


def test_a_real_pair_names_the_commits_it_loaded_and_diff_compares_them(tmp_path):
    p, a = run(tmp_path, "a", COMMIT)
    assert f"models: target Qwen/Qwen3-8B@main -> {COMMIT}; drafter z-lab/Qwen3-8B-DFlash-b16@v1 -> " \
           f"{DRAFT_COMMIT}" in p.stdout
    logs = "".join(f.read_text() for f in (tmp_path / "logs-a").rglob("*.log"))
    assert "--revision main" in logs and "--speculative-draft-model-revision v1" in logs  # SGLang's flags
    assert [(m["role"], m["commit"], m["complete"]) for m in a["models"]] == [
        ("target", COMMIT, True), ("drafter", DRAFT_COMMIT, True)]
    _, b = run(tmp_path, "b", "f" * 40)  # another host: the hub's main moved on
    d = subprocess.run([sys.executable, "-m", "dflashctl", "diff", "a.json", "b.json"], cwd=tmp_path,
                       capture_output=True, text=True, env=dict(os.environ), timeout=60)
    assert d.returncode == errors.FAILED, d.stdout + d.stderr
    row = next(line for line in d.stdout.splitlines() if "Qwen/Qwen3-8B commit" in line)
    assert COMMIT in row and "f" * 40 in row


def test_a_revision_without_its_model_is_a_usage_error(tmp_path):
    p = smoke(tmp_path, "--model-revision", COMMIT)
    assert p.returncode == errors.USAGE
    assert "--model-revision without --model" in p.stderr


def test_a_real_pair_that_does_not_fit_is_refused_before_any_server_starts(tmp_path):
    """Issue 33: serve's model-pair rules, read from the cache the servers would load from."""
    home = tmp_path / "hf"
    lay_out(home, "Qwen/Qwen3-8B", COMMIT, TARGET_FILES)
    wrong = {**DRAFT_FILES, "config.json": (MODELS / "llama3.1-8b-instruct-dflash-ultrachat" / "config.json").read_bytes()}
    lay_out(home, "z-lab/Qwen3-8B-DFlash-b16", DRAFT_COMMIT, wrong, ref="v1")
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", *real_pair_args(), "--model-revision", "main",
              "--draft-model-revision", "v1", HF_HOME=str(home))
    assert p.returncode == errors.PREFLIGHT_MODEL_PAIR, p.stderr
    assert "the model pair does not fit (2 problem(s)); no server was started" in p.stderr
    assert "models: vocab_size: drafter 128256 != target 151936" in p.stderr
    assert "started baseline" not in p.stderr and "Traceback" not in p.stderr
