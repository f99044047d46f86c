"""The synthetic target's tokenizer (dflashctl/smoke/tokenizer.py): deterministic, and fit for SGLang.

Built twice in separate processes (Rust's hash maps are seeded per process), the files must be
byte-identical. Loading through transformers is SGLang's part (checked on the H200,
benchmarks/gpu/smoke_grammar.sh); here the files are read back with `tokenizers` itself.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers  # the test extra (python/pyproject.toml) and the stack both have it

from dflashctl.smoke import grammar, synthetic, tokenizer

PYTHON_DIR = Path(__file__).resolve().parent.parent.parent / "python"
BUILD = ("import json, sys; from dflashctl.smoke import tokenizer; "
         "print(json.dumps(tokenizer.write(sys.argv[1], 151936)))")


def build_in_process(directory: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", BUILD, str(directory)], capture_output=True, text=True,
                       env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return root, build_in_process(root / "a"), build_in_process(root / "b")


def test_two_builds_give_the_same_files_and_hash(built):
    root, a, b = built
    assert a["sha256"] == b["sha256"] and a["files"] == b["files"]
    for name in tokenizer.FILES:
        assert (root / "a" / name).read_bytes() == (root / "b" / name).read_bytes()
    assert a["seconds"] >= 0  # reported, not asserted on: speed is a figure, not a test


def test_fits_the_synthetic_target(built):
    root, info, _ = built
    tok = tokenizers.Tokenizer.from_file(str(root / "a" / "tokenizer.json"))
    assert info["vocab_size"] == tok.get_vocab_size() == tokenizer.VOCAB_SIZE
    assert tok.get_vocab_size() <= synthetic.PairShape().vocab_size
    assert tok.token_to_id(tokenizer.EOS) == synthetic.SPECIAL_TOKEN_ID  # the config's bos/eos/pad
    cfg = json.loads((root / "a" / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == tokenizer.EOS and cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "add_generation_prompt" in cfg["chat_template"]


@pytest.mark.parametrize("text", ['<call>{"city":"Paris"}</call>', "bonjour Berlin!", "yes, 733 apples",
                                  '{"ok"\t\n: true}', "naïve café ☕"])
def test_byte_level_round_trip(built, text):
    """Byte-level: every string the grammars allow (and any other) encodes and decodes back."""
    root, _, _ = built
    tok = tokenizers.Tokenizer.from_file(str(root / "a" / "tokenizer.json"))
    ids = tok.encode(text).ids
    assert 0 not in ids and tok.decode(ids) == text


def test_grammar_words_are_whole_tokens(built):
    """The corpus holds the grammars' words, so outputs are a few tokens, not one per byte."""
    root, _, _ = built
    tok = tokenizers.Tokenizer.from_file(str(root / "a" / "tokenizer.json"))
    for word in ("Paris", "Berlin", "Tokyo", "apples", "pears", "hello", "bonjour"):
        assert len(tok.encode(word).ids) == 1, word
    assert len(tok.encode(grammar.TAG_BEGIN + '{"city":"Paris"}' + grammar.TAG_END).ids) < 16


def test_a_tokenizer_too_large_for_the_model_is_refused(tmp_path):
    with pytest.raises(Exception) as e:
        tokenizer.write(tmp_path, model_vocab_size=1000)
    assert "does not fit the synthetic target" in str(e.value)
