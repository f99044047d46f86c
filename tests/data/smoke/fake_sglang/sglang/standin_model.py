"""What the stand-in SGLang decodes: the models its flags name, and DFLASH's verify loop.

Two kinds of weights, as SGLang tells them apart:
- `--load-format dummy` (or no checkpoint to read): random weights. Greedy decoding is then some
  fixed function of the whole context; here a hash seeded by the model's config.json, so two
  servers of one config decode alike (the H200's baseline and DFLASH did) and another config
  differently. Random weights hit their EOS only by chance; here one token in EOS_EVERY is the
  EOS, so a request without ignore_eos ends early, as a real pair's would at its end of text.
  A random drafter proposes hashes of its own: practically never what the target decodes.
- a checkpoint (model.safetensors): read as a Qwen3 target / DFlash drafter whose one non-zero
  attention layer copies the token found at a fixed relative position (the oracle pair smoke
  writes, docs/smoke.md). Read from the tensors themselves: each token's id code (the embedding's
  non-constant dimension), the copy head's offset (the relative position where its RoPE score,
  query against key on the constant dimension, is largest), the output projection's map of codes
  (the poisoned drafter's) and the LM head's code -> token map. The target then decodes
  x[n + 1] = head(code(x[n - offset])); the drafter proposes for position q
  head(o_proj(code(x[q - offset]))). Nothing here imports dflashctl: a generator that wrote other
  weights than it says shows up as other outputs, as it would on a GPU.

`decode` runs plain decoding or DFLASH's loop (draft block_size - 1 tokens after the verified
one, keep the longest prefix the target agrees with plus the target's own next token), greedy at
temperature 0 (or top_k 1) and sampled otherwise. DDTREE is decoded as DFLASH: with a drafter that
is right or wrong everywhere the tree's other branches change nothing.
"""

import hashlib
import json
import math
import random
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

EOS_EVERY = 64  # random weights: one greedy token in this many is the EOS (see above)
DRAFT_ROPE_THETA = 1e6  # SGLang 0.5.11's DFlash drafter applies RoPE with theta 1e6 whatever its config says
NONZERO = re.compile(rb"[^\x00]")


class Safetensors:
    """The tensors of one safetensors file, read lazily by name."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.base = 8 + n

    def has(self, name: str) -> bool:
        return name in self.header

    def shape(self, name: str) -> list[int]:
        return self.header[name]["shape"]

    def raw(self, name: str) -> bytes:
        h = self.header[name]
        if h["dtype"] != "BF16":
            raise ValueError(f"{name}: {h['dtype']}, the stand-in reads BF16 only")
        lo, hi = h["data_offsets"]
        with open(self.path, "rb") as f:
            f.seek(self.base + lo)
            return f.read(hi - lo)

    def zero(self, name: str) -> bool:
        return not self.raw(name).strip(b"\x00")

    def row_columns(self, name: str) -> list[list[int]]:
        """For each row of a 2-D tensor, the columns holding a non-zero value."""
        rows, cols = self.shape(name)
        data, width = self.raw(name), 2 * cols
        out = []
        for r in range(rows):
            row = data[r * width:(r + 1) * width]
            out.append(sorted({m.start() // 2 for m in NONZERO.finditer(row)}) if row.strip(b"\x00") else [])
        return out

    def column(self, name: str, col: int, rows: range) -> list[float]:
        data, width = self.raw(name), 2 * self.shape(name)[1]
        return [_bf16(data, r * width + 2 * col) for r in rows]


def _bf16(data: bytes, offset: int) -> float:
    (bits,) = struct.unpack_from("<H", data, offset)
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def copy_offset(st: Safetensors, prefix: str, const: int, head_dim: int, theta: float) -> int:
    """The relative position (query minus key) where head 0's RoPE score is largest, for a query
    and a key that both come from the constant dimension `const` (neox rotation)."""
    half = head_dim // 2
    q = st.column(prefix + "self_attn.q_proj.weight", const, range(head_dim))
    k = st.column(prefix + "self_attn.k_proj.weight", const, range(head_dim))
    terms = []
    for j in range(half):
        a, b, c, d = q[j], q[j + half], k[j], k[j + half]
        if a or b:
            terms.append((theta ** (-2.0 * j / head_dim), a * c + b * d, b * c - a * d))

    def score(r: int) -> float:
        return sum(re_ * math.cos(r * w) - im * math.sin(r * w) for w, re_, im in terms)
    return max(range(512), key=score)


def _code_map(rows: list[list[int]], skip: int | None = None) -> dict[int, int]:
    """row -> its one non-zero column (`skip` aside), for rows with exactly one."""
    out = {}
    for r, cols in enumerate(rows):
        cols = [c for c in cols if c != skip]
        if len(cols) == 1:
            out[r] = cols[0]
    return out


def _inverse(rows: list[list[int]]) -> dict[int, int]:
    """column -> the row holding its non-zero value (a matrix that maps dimension c to row r)."""
    out = {}
    for r, cols in enumerate(rows):
        for c in cols:
            out[c] = r
    return out


class Unreadable(Exception):
    """Weights the stand-in cannot read as a copy rule: it decodes them as random weights."""


@dataclass
class RuleTarget:
    code: dict[int, int]  # token -> its id dimension
    head: dict[int, int]  # id dimension -> the token the LM head gives it
    offset: int  # the copy layer attends this far back
    const: int
    vocab: int

    @classmethod
    def read(cls, root: Path, cfg: dict) -> "RuleTarget":
        st = Safetensors(root / "model.safetensors")
        embed = st.row_columns("model.embed_tokens.weight")
        shared = set(embed[0]).intersection(*map(set, embed[1:]))
        if len(shared) != 1:
            raise Unreadable("no constant embedding dimension")
        const = shared.pop()
        copies = [n for n in range(cfg["num_hidden_layers"])
                  if not st.zero(f"model.layers.{n}.self_attn.q_proj.weight")]
        if len(copies) != 1:
            raise Unreadable(f"{len(copies)} attention layers with a query, not one")
        offset = copy_offset(st, f"model.layers.{copies[0]}.", const, cfg["head_dim"], cfg["rope_theta"])
        return cls(_code_map(embed, const), _inverse(st.row_columns("lm_head.weight")), offset, const,
                   cfg["vocab_size"])

    def start(self, prompt: list[int]) -> list:
        return [list(prompt)]

    def next(self, state: list) -> int | None:
        seq = state[0]
        src = len(seq) - 1 - self.offset
        return self.head.get(self.code.get(seq[src])) if src >= 0 else None

    def push(self, state: list, token: int) -> None:
        state[0].append(token)


@dataclass
class RuleDrafter:
    target: RuleTarget
    source: dict[int, int]  # id dimension read -> id dimension written (o_proj after v_proj)
    offset: int

    @classmethod
    def read(cls, root: Path, cfg: dict, target: RuleTarget) -> "RuleDrafter":
        st = Safetensors(root / "model.safetensors")
        copies = [n for n in range(cfg["num_hidden_layers"]) if not st.zero(f"layers.{n}.self_attn.q_proj.weight")]
        if len(copies) != 1:
            raise Unreadable(f"{len(copies)} draft attention layers with a query, not one")
        p = f"layers.{copies[0]}."
        value = _code_map(st.row_columns(p + "self_attn.v_proj.weight"))  # value dim -> residual dim read
        out = _inverse(st.row_columns(p + "self_attn.o_proj.weight"))  # value dim -> residual dim written
        source = {dim: out[v] for v, dim in value.items() if v in out}
        return cls(target, source, copy_offset(st, p, target.const, cfg["head_dim"], DRAFT_ROPE_THETA))

    def propose(self, seq: list[int], verified: int, i: int) -> int | None:
        """The draft for position verified + i; only committed positions (and the verified token
        in the block's first slot) carry an id code."""
        src = verified + i - self.offset
        if not 0 <= src <= verified:
            return None
        return self.target.head.get(self.source.get(self.target.code.get(seq[src])))


def _seed(root: str) -> bytes:
    cfg = Path(root) / "config.json"
    try:
        return hashlib.sha256(cfg.read_bytes()).digest()
    except OSError:
        return hashlib.sha256(root.encode()).digest()


@dataclass
class HashTarget:
    seed: bytes
    vocab: int
    eos: int | None

    def start(self, prompt: list[int]) -> list:
        h = self.seed
        for t in prompt:
            h = hashlib.blake2b(h + t.to_bytes(4, "little"), digest_size=16).digest()
        return [list(prompt), h]

    def next(self, state: list) -> int:
        v = int.from_bytes(state[1], "little")
        if self.eos is not None and (v >> 64) % EOS_EVERY == 0:
            return self.eos
        return v % self.vocab

    def push(self, state: list, token: int) -> None:
        state[0].append(token)
        state[1] = hashlib.blake2b(state[1] + token.to_bytes(4, "little"), digest_size=16).digest()


@dataclass
class HashDrafter:
    seed: bytes
    vocab: int

    def propose(self, seq: list[int], verified: int, i: int) -> int:
        h = hashlib.blake2b(self.seed + repr((seq[-8:], len(seq), i)).encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") % self.vocab


def load_target(path: str, dummy: bool):
    cfg = _config(path)
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if not dummy and (Path(path) / "model.safetensors").is_file():
        try:
            return RuleTarget.read(Path(path), cfg), eos
        except (Unreadable, KeyError, ValueError):
            pass
    return HashTarget(_seed(path), cfg.get("vocab_size", 151936), eos), eos


def load_drafter(path: str, dummy: bool, target):
    if not dummy and isinstance(target, RuleTarget) and (Path(path) / "model.safetensors").is_file():
        try:
            return RuleDrafter.read(Path(path), _config(path), target)
        except (Unreadable, KeyError, ValueError):
            pass
    return HashDrafter(_seed(path) + b"draft", getattr(target, "vocab", 151936))


def block_size(path: str, flag: int | None) -> int:
    if flag:
        return flag
    cfg = _config(path)
    return (cfg.get("dflash_config") or {}).get("block_size") or cfg.get("block_size") or 16


def _config(path: str) -> dict:
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Sampling:
    """A request's sampling_params as SGLang 0.5.11 defaults and reads them."""
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    min_new_tokens: int = 0
    stop_token_ids: list = field(default_factory=list)
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return 0 <= self.temperature < 1e-6 or self.top_k == 1


@dataclass
class Decoded:
    ids: list[int]
    commits: list[int]  # tokens each step added: the prefill's first token, then one entry per step
    finish: dict
    verify_ct: int = 0
    accepted: int = 0
    proposed: int = 0


def decode(target, drafter, block: int, prompt: list[int], s: Sampling, eos: int | None,
           diverge: dict[int, int] | None = None, accept_all: bool = False) -> Decoded:
    """Plain decoding (drafter None) or DFLASH's loop over `target`'s rule, as SGLang streams it.
    `diverge` {position: delta}: a broken server's token at that position, later ones follow it."""
    rng = random.Random(s.sampling_seed) if s.sampling_seed is not None else random.SystemRandom()
    state = target.start(prompt)
    out: list[int] = []
    stops = set(s.stop_token_ids or ())
    if eos is not None and not s.ignore_eos:
        stops.add(eos)
    vocab = target.vocab

    def next_token() -> int:
        t = target.next(state)
        if t is None:
            raise ValueError("the stand-in cannot continue this prompt with these weights "
                             "(a token without an id code)")
        if not s.greedy and rng.random() < 0.5:
            t = rng.randrange(vocab)
        if diverge and len(out) in diverge:
            t = (t + diverge[len(out)]) % vocab
        return t

    def commit(t: int) -> bool:
        """Append t; True when the request is done."""
        out.append(t)
        target.push(state, t)
        return len(out) >= s.max_new_tokens or (t in stops and len(out) >= s.min_new_tokens)

    if s.max_new_tokens <= 0:
        return Decoded([], [], {"type": "length", "length": 0})
    d = Decoded(out, [1], {})
    done = commit(next_token())
    while not done:
        if drafter is None:
            done = commit(next_token())
            d.commits.append(1)
            continue
        verified = len(state[0]) - 1
        drafts = [drafter.propose(state[0], verified, i) for i in range(1, block)]
        d.verify_ct += 1
        d.proposed += block - 1
        n = 0
        for i in range(block):
            t = next_token()
            right = i < block - 1 and (accept_all or drafts[i] == t)
            done = commit(t)
            n += 1
            if not right or done:
                break
            d.accepted += 1
        d.commits.append(n)
    last = out[-1]
    stopped = last in stops and len(out) >= s.min_new_tokens
    d.finish = {"type": "stop", "matched": last} if stopped else {"type": "length", "length": len(out)}
    return d
