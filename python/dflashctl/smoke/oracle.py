"""The oracle pair: a Qwen3 target and DFlash drafters whose weights are set by hand.

No training, no randomness: the target's greedy rule is x[n] = succ(x[n - LAG]), where succ is the
successor on the ids [LO, HI) (cyclic) and the identity elsewhere. One attention head pattern
does it: a query and a key built from a constant embedding dimension only, so that after RoPE
their score is largest at one relative offset; the value and output projections copy the one-hot
id code of the token found there into the residual stream, and the LM head maps id t to succ(t).

- target: layers 0..N-2 are exact identities (all projections zero), the last layer holds the
  copy pattern at offset LAG - 1 (the token at n - LAG + 1 decides x[n + 1]).
- oracle drafter: the target's features after the capture layers equal its embedding (identity
  layers), `fc` keeps the first capture's copy, draft layer 0 copies at offset LAG: block index i
  at position p + i reads position p + i - LAG, which is committed context or the verified token
  itself, and the target's LM head applies succ. Every drafted token is right: a verify step
  commits the whole block.
- poisoned drafter: the same, but its output projection sends every 13th id of [LO, HI) to the
  next id, so the draft after such a token is wrong. Verify accepts a prefix of each block.
- broken drafter (`draft_offset_error`, smoke's `--pair broken`): the copy head reads one position
  off, as a draft path with its block positions shifted would: nearly every draft is rejected.

Written as config.json, generation_config.json and model.safetensors per model, every tensor
present (SGLang leaves a missing tensor uninitialised without a word), in bf16, with the standard
library only, so any interpreter that runs SGLang runs this. The same shape gives the same bytes
on every machine: `content_hash` names them, and a pair already in the target directory with that
hash is reused. docs/smoke.md says what the pair proves and what each shape choice costs.

Tensor parallelism (`smoke --tp-size N`): SGLang splits the heads, the KV heads and the MLP over
the GPUs (synthetic.tp_problems), and the default shape's 16 heads, 16 KV heads and MLP of 64
shard over 2, 4, 8 and 16 as they are. The construction survives the split: head h of the target
and of the oracle drafter writes only the residual dims of its own 64 value dims, so each GPU's
share of o_proj is zero elsewhere and the all-reduce adds zeros.
"""

import hashlib
import json
import math
import os
import struct
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.smoke import synthetic

GENERATOR_VERSION = 1  # bump when the bytes written for a shape change
SPECIAL_TOKEN_ID = 0  # bos, eos and pad; requests use ignore_eos
MODELS = ("target", "draft", "draft-poisoned")


@dataclass(frozen=True)
class OracleShape:
    hidden_size: int = 1024  # one-hot id code in dims 0..hidden-2, a constant 1 in the last dim
    heads: int = 16
    kv_heads: int = 16  # values carry hidden-1 id dims: kv_heads x head_dim >= hidden - 1
    head_dim: int = 64
    intermediate_size: int = 64  # every MLP is zero: its size only costs bytes
    target_layers: int = 8
    draft_layers: int = 2
    vocab_size: int = 4096  # rows >= hidden-1 carry no id code; 151936 would make the target 660 MiB
    mask_token_id: int = 4095  # no id code, never produced by succ
    block_size: int = 16
    target_layer_ids: tuple[int, ...] = (1, 5)  # captured features: identity layers, so = embedding
    lag: int = 15  # x[n] = succ(x[n - lag]); lag >= block_size - 1 keeps every draft source committed
    lo: int = 10  # succ cycles on [lo, hi); prompts must draw from it
    hi: int = 1000
    rope_theta: float = 1e6  # SGLang 0.5.11's drafter uses 1e6 whatever its config says
    rope_frequencies: int = 8  # the highest RoPE frequencies the copy pattern uses
    qk_gain: float = 5.0  # q_norm / k_norm weight of the copy heads: a sharp softmax
    poison_every: int = 13  # poisoned drafter: ids lo, lo+13, lo+26, ... are copied as their successor
    draft_offset_error: int = 0  # != 0: both drafters read that many positions off (`--pair broken`)

    @property
    def ids(self) -> int:
        return self.hidden_size - 1

    @property
    def const_dim(self) -> int:
        return self.hidden_size - 1


def succ(s: OracleShape, t: int) -> int:
    """The target's rule applied to one id: the next id of [lo, hi), cyclic; others unchanged."""
    return s.lo + (t - s.lo + 1) % (s.hi - s.lo) if s.lo <= t < s.hi else t


def poisoned_source(s: OracleShape, t: int) -> int:
    """What the poisoned drafter's copy head writes for source id t (the oracle writes t)."""
    return succ(s, t) if s.lo <= t < s.hi and (t - s.lo) % s.poison_every == 0 else t


def check_shape(s: OracleShape) -> list[str]:
    """Why a shape cannot carry the construction; empty when it can."""
    problems = []
    if s.heads * s.head_dim != s.hidden_size:
        problems.append(f"heads x head_dim = {s.heads * s.head_dim}, not hidden_size {s.hidden_size}")
    if s.kv_heads * s.head_dim < s.ids or s.heads % s.kv_heads:
        problems.append(f"kv_heads x head_dim must hold {s.ids} id dims and divide the heads")
    if not 0 < s.lo < s.hi <= s.ids:
        problems.append(f"active ids [{s.lo}, {s.hi}) must lie inside the {s.ids} coded ids")
    if not s.ids <= s.mask_token_id < s.vocab_size:
        problems.append(f"mask_token_id {s.mask_token_id} must carry no id code (>= {s.ids}) and be < vocab")
    if s.lag < s.block_size - 1:
        problems.append(f"lag {s.lag} < block_size - 1: a draft would read an undrafted position")
    if not s.target_layer_ids or max(s.target_layer_ids) >= s.target_layers - 1:
        problems.append("capture layers must come before the target's last (copy) layer")
    if 2 * s.rope_frequencies > s.head_dim:
        problems.append("rope_frequencies must be at most head_dim / 2")
    return problems


# --- tensors: a shape and the few entries that are not zero --------------------------------------

@dataclass
class Tensor:
    shape: tuple[int, ...]
    entries: dict[int, float]  # flat (row-major) index -> value; everything else 0

    def set(self, row: int, col: int, value: float) -> None:
        self.entries[row * self.shape[1] + col] = value


def _filled(n: int, value: float) -> Tensor:
    return Tensor((n,), {i: value for i in range(n)})


def _zero(*shape: int) -> Tensor:
    return Tensor(tuple(shape), {})


def _rope_angle(s: OracleShape, j: int) -> float:
    return s.rope_theta ** (-2.0 * j / s.head_dim)


def _layer(s: OracleShape, prefix: str, copy_offset: int | None = None, source=None) -> dict[str, Tensor]:
    """One decoder layer; with copy_offset, every head attends to that relative offset and copies
    the id code found there (`source(t)`: the residual dim written for value dim t)."""
    d, q_rows, kv_rows = s.hidden_size, s.heads * s.head_dim, s.kv_heads * s.head_dim
    t = {
        "input_layernorm.weight": _filled(d, 1.0),
        "post_attention_layernorm.weight": _filled(d, 1.0),
        "self_attn.q_proj.weight": _zero(q_rows, d),
        "self_attn.k_proj.weight": _zero(kv_rows, d),
        "self_attn.v_proj.weight": _zero(kv_rows, d),
        "self_attn.o_proj.weight": _zero(d, q_rows),
        "self_attn.q_norm.weight": _filled(s.head_dim, 1.0),
        "self_attn.k_norm.weight": _filled(s.head_dim, 1.0),
        "mlp.gate_proj.weight": _zero(s.intermediate_size, d),
        "mlp.up_proj.weight": _zero(s.intermediate_size, d),
        "mlp.down_proj.weight": _zero(d, s.intermediate_size),
    }
    if copy_offset is not None:
        half = s.head_dim // 2
        # After neox RoPE, q at position n and k at m score sum_j cos((n - m - offset) * w_j):
        # q = (cos(offset w_j), -sin(offset w_j)) on the pair (j, j + half), k = (1, 0).
        for h in range(s.heads):
            for j in range(s.rope_frequencies):
                w = _rope_angle(s, j)
                t["self_attn.q_proj.weight"].set(h * s.head_dim + j, s.const_dim, math.cos(copy_offset * w))
                t["self_attn.q_proj.weight"].set(h * s.head_dim + half + j, s.const_dim, -math.sin(copy_offset * w))
        for h in range(s.kv_heads):
            for j in range(s.rope_frequencies):
                t["self_attn.k_proj.weight"].set(h * s.head_dim + j, s.const_dim, 1.0)
        for i in range(s.ids):
            t["self_attn.v_proj.weight"].set(i, i, 1.0)
            t["self_attn.o_proj.weight"].set(source(i) if source else i, i, 1.0)
        t["self_attn.q_norm.weight"] = _filled(s.head_dim, s.qk_gain)
        t["self_attn.k_norm.weight"] = _filled(s.head_dim, s.qk_gain)
    return {prefix + k: v for k, v in t.items()}


def target_tensors(s: OracleShape) -> dict[str, Tensor]:
    d = s.hidden_size
    embed = _zero(s.vocab_size, d)
    for row in range(s.vocab_size):
        embed.set(row, s.const_dim, 1.0)
    for i in range(s.ids):
        embed.set(i, i, 1.0)
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": _filled(d, 1.0)}
    last = s.target_layers - 1
    for n in range(s.target_layers):
        out.update(_layer(s, f"model.layers.{n}.", s.lag - 1 if n == last else None))
    head = _zero(s.vocab_size, d)
    for i in range(s.ids):
        head.set(succ(s, i), i, 1.0)  # logit of succ(t) reads residual dim t
    out["lm_head.weight"] = head
    return out


def draft_tensors(s: OracleShape, poisoned: bool = False) -> dict[str, Tensor]:
    d = s.hidden_size
    source = (lambda t: poisoned_source(s, t)) if poisoned else None
    out = {"norm.weight": _filled(d, 1.0), "hidden_norm.weight": _filled(d, 1.0)}
    fc = _zero(d, len(s.target_layer_ids) * d)
    for i in range(d):
        fc.set(i, i, 1.0)  # the first captured layer's features, unchanged
    out["fc.weight"] = fc
    for n in range(s.draft_layers):
        out.update(_layer(s, f"layers.{n}.", s.lag + s.draft_offset_error if n == 0 else None, source))
    return out


# --- configs ---------------------------------------------------------------------------------------

def target_config(s: OracleShape) -> dict:
    return synthetic.qwen3_config(s, 8192, s.rope_theta)


def draft_config(s: OracleShape) -> dict:
    return synthetic.dflash_draft_config(s, target_config(s))


# --- bytes -----------------------------------------------------------------------------------------

def bf16_bits(value: float) -> int:
    """The bfloat16 nearest to `value` (ties to even), as its 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def safetensors_bytes(tensors: dict[str, Tensor]) -> bytes:
    """The safetensors file: an 8-byte header length, a JSON header (names sorted, padded to 8
    bytes with spaces), then each tensor's bf16 data in the header's order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        count = math.prod(t.shape)
        data = bytearray(2 * count)
        for index, value in t.entries.items():
            struct.pack_into("<H", data, 2 * index, bf16_bits(value))
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt", "generator": f"dflashctl oracle v{GENERATOR_VERSION}"}
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *blobs])


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def files(s: OracleShape) -> dict[str, bytes]:
    """Every file of the pair, by path relative to the pair's directory."""
    problems = check_shape(s)
    if problems:
        raise DflashError("the oracle pair's shape cannot carry its construction", "; ".join(problems),
                          "use the default OracleShape or fix the fields named")
    gen = _json({"bos_token_id": SPECIAL_TOKEN_ID, "eos_token_id": SPECIAL_TOKEN_ID,
                 "pad_token_id": SPECIAL_TOKEN_ID})
    out = {"target/config.json": _json(target_config(s)), "target/generation_config.json": gen,
           "target/model.safetensors": safetensors_bytes(target_tensors(s))}
    for name, poisoned in (("draft", False), ("draft-poisoned", True)):
        out[f"{name}/config.json"] = _json(draft_config(s))
        out[f"{name}/generation_config.json"] = gen
        out[f"{name}/model.safetensors"] = safetensors_bytes(draft_tensors(s, poisoned))
    return out


def content_hash(file_map: dict[str, bytes]) -> str:
    """sha256 over each file's path and sha256, in path order: the pair's name."""
    h = hashlib.sha256()
    for path in sorted(file_map):
        h.update(f"{path}\0{hashlib.sha256(file_map[path]).hexdigest()}\n".encode())
    return h.hexdigest()


def hash_of_dir(root: Path) -> str | None:
    """The content hash of a pair on disk; None when a file is missing."""
    found = {}
    for name in MODELS:
        for f in ("config.json", "generation_config.json", "model.safetensors"):
            try:
                found[f"{name}/{f}"] = (root / name / f).read_bytes()
            except OSError:
                return None
    return content_hash(found)


@dataclass
class Pair:
    root: Path
    content_hash: str
    reused: bool
    shape: OracleShape

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def poisoned(self) -> Path:
        return self.root / "draft-poisoned"

    def to_json(self) -> dict:
        sizes = {p.name: (p / "model.safetensors").stat().st_size for p in (self.target, self.draft, self.poisoned)}
        return {"pair": "oracle", "content_hash": self.content_hash, "reused": self.reused, "root": str(self.root),
                "generator_version": GENERATOR_VERSION, "safetensors_bytes": sizes,
                "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.shape).items()}}


def write_pair(parent: Path | str, s: OracleShape = OracleShape()) -> Pair:
    """The pair under parent/oracle-<hash>/: reused when a pair with that content is there, else
    written (into a temporary directory renamed into place, so a half-written pair never counts)."""
    file_map = files(s)
    digest = content_hash(file_map)
    parent = Path(parent)
    root = parent / f"oracle-{digest[:16]}"
    if root.is_dir() and hash_of_dir(root) == digest:
        return Pair(root, digest, True, s)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".oracle-", dir=parent))
    for rel, data in file_map.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    if root.exists():  # a damaged earlier copy
        _remove(root)
    try:
        os.rename(tmp, root)
    except OSError:  # another smoke renamed its copy into place first: the same bytes
        _remove(tmp)
        if hash_of_dir(root) != digest:
            raise
    return Pair(root, digest, False, s)


def _remove(path: Path) -> None:
    for p in sorted(path.rglob("*"), key=lambda x: len(x.parts), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


# --- what the smoke expects of the pair ------------------------------------------------------------

def greedy(s: OracleShape, prompt: list[int], n: int) -> list[int]:
    """The target's greedy continuation by its rule (what a correct server must return)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(succ(s, seq[len(seq) - s.lag]))
    return seq[len(prompt):]


def verify_steps(s: OracleShape, prompt: list[int], n: int, poisoned: bool) -> list[int]:
    """Tokens committed by each verify step of DFLASH with the oracle (or poisoned) drafter, by
    the rule: the first token comes from prefill; each step drafts block_size - 1 tokens after the
    verified one, the target accepts the longest right prefix and adds its own next token."""
    seq = list(prompt) + greedy(s, prompt, n + s.block_size)  # drafts may look past the end
    done, steps = 1, []
    while done < n:
        p = len(prompt) + done - 1  # position of the verified token
        accepted = 0
        for i in range(1, s.block_size):
            src = seq[p + i - s.lag]
            drafted = succ(s, poisoned_source(s, src) if poisoned else src)
            if drafted != seq[p + i]:
                break
            accepted += 1
        commit = min(accepted + 1, n - done)
        steps.append(commit)
        done += commit
    return steps


def expected_accept_length(s: OracleShape, prompts: list[list[int]], n: int, poisoned: bool) -> float:
    """Completion tokens per verify step over all prompts, as SGLang counts it."""
    verify = sum(len(verify_steps(s, p, n, poisoned)) for p in prompts)
    return n * len(prompts) / verify if verify else 0.0
