"""A small byte-level BPE tokenizer for the synthetic target, trained here in about a second.

SGLang runs a grammar backend only when it has a tokenizer (`--skip-tokenizer-init` switches
constrained decoding off), and the synthetic target has none to download. So smoke trains one with
`tokenizers` (locked: transformers needs it) on a corpus built into this file: 3,000 tokens,
byte-level like Qwen's (every string is encodable), `<|endoftext|>` at id 0 = the synthetic
config's bos/eos/pad, plus a chat template for `/v1/chat/completions`. The same corpus and settings
give byte-identical files on every run (tests/smoke/test_tokenizer.py compares their hashes).
"""

import hashlib
import itertools
import json
import time
from pathlib import Path

from dflashctl.errors import PREFLIGHT_SGLANG, DflashError

VOCAB_SIZE = 3000
EOS = "<|endoftext|>"  # id 0: synthetic.SPECIAL_TOKEN_ID
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Roles as plain text; the tools of a tool-call request are not rendered: the grammar, not the
# prompt, makes the output a call (random weights would not read the prompt anyway).
CHAT_TEMPLATE = ("{%- for message in messages -%}<|{{ message['role'] }}|>{{ message['content'] or '' }}\n"
                 "{% endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")

_WORDS = """the a an of to in on for with from by at as is are was were be been it this that these
those and or but not no yes true false null none all any each every some many few one two three
four five six seven eight nine ten hundred thousand first second last next new old good bad big
small long short high low hot cold red green blue black white yellow orange purple city town river
lake mountain sea Paris Berlin London Rome Madrid Vienna Prague Lisbon Oslo Tokyo Delhi Cairo Lima
Quito Sydney weather rain snow sun wind cloud storm today tomorrow morning evening night week month
year time day hour minute call tool function name parameters arguments result value key string
number integer boolean object array schema type enum required properties answer question request
response server client model token tokenizer grammar regex json ebnf tag format output input text
word sentence hello bonjour world apple apples pear pears oranges bread water coffee tea milk cheese
house""".split()


def corpus() -> list[str]:
    """The training text: word triples, JSON objects and syllable words; fixed, about 0.5 MB."""
    lines = []
    triples = itertools.islice(itertools.product(_WORDS, repeat=3), 0, None, 7)
    for i, (a, b, c) in enumerate(itertools.islice(triples, 20002)):
        lines.append(f"{a} {b} {c}, {i}.")
    for n in range(1000):
        ok = "true" if n % 2 else "false"
        lines.append(f'{{"id": {n}, "ok": {ok}, "city": "{_WORDS[n % len(_WORDS)]}"}}')
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for i, (x, y) in enumerate(itertools.product(syllables, repeat=2)):
        lines.append(f"{x}{y} {y}{x} {x}{y}{syllables[i % len(syllables)]}")
    return lines


def _tokenizers():
    try:
        import tokenizers
    except ImportError as e:
        raise DflashError("cannot build the synthetic tokenizer: the Python package `tokenizers` is missing",
                          str(e), "run smoke with the stack's interpreter (nix run .#dflash-smoke), or skip the "
                          "grammar phase with --no-grammar", PREFLIGHT_SGLANG) from None
    return tokenizers


def train(vocab_size: int = VOCAB_SIZE):
    """The trained `tokenizers.Tokenizer` (byte-level BPE, Qwen-style pre-tokenization)."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    tok.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


def config() -> dict:
    """tokenizer_config.json: loads with transformers' AutoTokenizer, as SGLang does."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
            "pad_token": EOS, "unk_token": None, "model_max_length": 8192,
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}


def write(directory: Path | str, model_vocab_size: int, vocab_size: int = VOCAB_SIZE) -> dict:
    """Write the tokenizer files into `directory` (the target model's folder); returns what was
    written: {"vocab_size", "sha256" (over all files), "files", "seconds"}."""
    t0 = time.monotonic()
    tok = train(vocab_size)
    n = tok.get_vocab_size()
    if n > model_vocab_size or tok.token_to_id(EOS) != 0:
        raise DflashError("the synthetic tokenizer does not fit the synthetic target",
                          f"{n} tokens (the model has {model_vocab_size}), {EOS} at id {tok.token_to_id(EOS)} "
                          "(the model's eos is 0)", "report this: tokenizer.py and synthetic.py disagree")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    texts = {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(config(), indent=2) + "\n",
        "special_tokens_map.json": json.dumps({"bos_token": EOS, "eos_token": EOS, "pad_token": EOS},
                                              indent=2) + "\n",
    }
    whole = hashlib.sha256()
    files = {}
    for name in FILES:
        data = texts[name].encode()
        (directory / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
        whole.update(name.encode() + b"\0" + data)
    return {"vocab_size": n, "sha256": whole.hexdigest(), "files": files,
            "seconds": round(time.monotonic() - t0, 2)}
