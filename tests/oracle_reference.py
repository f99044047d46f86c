"""A numpy forward of the oracle pair as SGLang 0.5.11 computes it, read from the files written.

Independent of the generator: it knows nothing of how the weights were built, only the file
format and the two architectures (Qwen3ForCausalLM, DFlashDraftModel), with bf16 rounding where
SGLang stores a bf16 tensor. `Target` keeps a KV cache per layer and position; `speculative`
runs DFLASH's loop (draft a block from the captured features, verify it with the target in one
pass, keep the accepted prefix plus the target's own next token, free the rest), with an optional
fault in the KV step, so a broken cache shows up as a divergence.
"""

import json
import struct
from pathlib import Path

import numpy as np


def bf16(x) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def load(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file of BF16 tensors, as float32 arrays."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "BF16", (name, h["dtype"])
        lo, hi = h["data_offsets"]
        half = np.frombuffer(raw[8 + n + lo:8 + n + hi], np.uint16)
        out[name] = (half.astype(np.uint32) << 16).view(np.float32).reshape(h["shape"])
    return out


def rmsnorm(x, w, eps):
    x = x.astype(np.float32)
    return bf16(x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w)


def linear(x, w):
    return bf16(x @ w.T)


class Arch:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.heads, self.kv_heads, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.inv_freq = (1.0 / cfg["rope_theta"] ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
                         ).astype(np.float32)

    def rope(self, x, pos):
        """neox-style rotary embedding of x [n, heads, hd] at positions pos [n]."""
        ang = pos.astype(np.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :self.hd // 2], x[..., self.hd // 2:]
        return bf16(np.concatenate([a * cos - b * sin, b * cos + a * sin], -1))

    def qkv(self, W, p, x, pos):
        n = len(x)
        q = linear(x, W[p + "self_attn.q_proj.weight"]).reshape(n, self.heads, self.hd)
        k = linear(x, W[p + "self_attn.k_proj.weight"]).reshape(n, self.kv_heads, self.hd)
        v = linear(x, W[p + "self_attn.v_proj.weight"]).reshape(n, self.kv_heads, self.hd)
        q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], self.eps)
        k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], self.eps)
        return self.rope(q, pos), self.rope(k, pos), v

    def attend(self, q, k, v, allowed):
        """q [nq, H, hd] over k, v [nk, KV, hd]; allowed [nq, nk]."""
        rep = self.heads // self.kv_heads
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd)
        s = np.where(allowed[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        return bf16(np.einsum("hqk,khd->qhd", s, v)).reshape(len(q), self.heads * self.hd)

    def mlp(self, W, p, x):
        g, u = linear(x, W[p + "mlp.gate_proj.weight"]), linear(x, W[p + "mlp.up_proj.weight"])
        return linear(bf16(g / (1 + np.exp(-g)) * u), W[p + "mlp.down_proj.weight"])


class Target(Arch):
    def __init__(self, root: Path):
        super().__init__(json.loads((root / "config.json").read_text()))
        self.W = load(root / "model.safetensors")
        self.layers = self.cfg["num_hidden_layers"]
        self.k = [dict() for _ in range(self.layers)]  # layer -> position -> [KV, hd]
        self.v = [dict() for _ in range(self.layers)]

    def forward(self, ids, pos, capture=()):
        """Tokens `ids` at positions `pos` (after every cached position): greedy next ids,
        the captured features (hidden + residual after each layer in `capture`, concatenated)
        and the smallest top-1 minus top-2 logit gap."""
        W = self.W
        h = W["model.embed_tokens.weight"][np.asarray(ids)]
        res, feats = None, []
        for n in range(self.layers):
            p = f"model.layers.{n}."
            res = h if res is None else bf16(h + res)
            x = rmsnorm(res, W[p + "input_layernorm.weight"], self.eps)
            q, k, v = self.qkv(W, p, x, pos)
            for j, P in enumerate(pos):
                self.k[n][int(P)], self.v[n][int(P)] = k[j], v[j]
            cached = np.array(sorted(self.k[n]))
            keys = np.stack([self.k[n][P] for P in cached])
            vals = np.stack([self.v[n][P] for P in cached])
            o = self.attend(q, keys, vals, cached[None, :] <= pos[:, None])
            res = bf16(linear(o, W[p + "self_attn.o_proj.weight"]) + res)
            h = self.mlp(W, p, rmsnorm(res, W[p + "post_attention_layernorm.weight"], self.eps))
            if n in capture:
                feats.append(bf16(h + res))
        out = rmsnorm(bf16(h + res), W["model.norm.weight"], self.eps)
        logits = bf16(out @ W["lm_head.weight"].T)
        top = np.sort(logits, -1)
        aux = np.concatenate(feats, -1) if feats else None
        return logits.argmax(-1), aux, float((top[:, -1] - top[:, -2]).min())

    def free(self, positions):
        for n in range(self.layers):
            for P in positions:
                self.k[n].pop(int(P), None)
                self.v[n].pop(int(P), None)


class Drafter(Arch):
    def __init__(self, root: Path, target: Target):
        super().__init__(json.loads((root / "config.json").read_text()))
        self.W, self.target = load(root / "model.safetensors"), target
        self.layers = self.cfg["num_hidden_layers"]
        d = self.cfg["dflash_config"]
        self.capture, self.mask, self.block = tuple(d["target_layer_ids"]), d["mask_token_id"], d["block_size"]
        self.k = [dict() for _ in range(self.layers)]
        self.v = [dict() for _ in range(self.layers)]

    def add_context(self, aux, pos):
        """The target's captured features of committed positions become each layer's K/V."""
        ctx = rmsnorm(linear(aux, self.W["fc.weight"]), self.W["hidden_norm.weight"], self.eps)
        for n in range(self.layers):
            p = f"layers.{n}."
            k = linear(ctx, self.W[p + "self_attn.k_proj.weight"]).reshape(len(ctx), self.kv_heads, self.hd)
            v = linear(ctx, self.W[p + "self_attn.v_proj.weight"]).reshape(len(ctx), self.kv_heads, self.hd)
            k = self.rope(rmsnorm(k, self.W[p + "self_attn.k_norm.weight"], self.eps), pos)
            for j, P in enumerate(pos):
                self.k[n][int(P)], self.v[n][int(P)] = k[j], v[j]

    def draft(self, verified: int, start: int) -> list[int]:
        """The block at positions start..start+block-1: the verified token then masks, attending
        to the context and (non-causally) to the whole block; the target's LM head reads it."""
        ids = np.full(self.block, self.mask)
        ids[0] = verified
        pos = start + np.arange(self.block)
        h = self.target.W["model.embed_tokens.weight"][ids]
        res = None
        for n in range(self.layers):
            p = f"layers.{n}."
            res = h if res is None else bf16(h + res)
            x = rmsnorm(res, self.W[p + "input_layernorm.weight"], self.eps)
            q, k, v = self.qkv(self.W, p, x, pos)
            ctx = sorted(P for P in self.k[n] if P < start)
            keys = np.concatenate([np.stack([self.k[n][P] for P in ctx]), k])
            vals = np.concatenate([np.stack([self.v[n][P] for P in ctx]), v])
            o = self.attend(q, keys, vals, np.ones((self.block, len(keys)), bool))
            res = bf16(linear(o, self.W[p + "self_attn.o_proj.weight"]) + res)
            h = self.mlp(self.W, p, rmsnorm(res, self.W[p + "post_attention_layernorm.weight"], self.eps))
        out = rmsnorm(bf16(h + res), self.W["norm.weight"], self.eps)
        logits = bf16(out[1:] @ self.target.W["lm_head.weight"].T)
        return [int(verified)] + [int(t) for t in logits.argmax(-1)]


def plain(target_dir: Path, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decoding one token at a time; the ids and the smallest logit gap met."""
    t = Target(target_dir)
    ids, _, gap = t.forward(prompt, np.arange(len(prompt)))
    out = [int(ids[-1])]
    while len(out) < n:
        ids, _, g = t.forward([out[-1]], np.array([len(prompt) + len(out) - 1]))
        out.append(int(ids[-1]))
        gap = min(gap, g)
    return out, gap


def speculative(target_dir: Path, draft_dir: Path, prompt: list[int], n: int,
                fault: str | None = None) -> tuple[list[int], list[int]]:
    """DFLASH's loop; the ids and the tokens each verify step committed. fault="stale_kv": the
    accepted drafts' target KV is replaced by the verified token's (a cache written to the wrong
    slots)."""
    t = Target(target_dir)
    d = Drafter(draft_dir, t)
    ids, aux, _ = t.forward(prompt, np.arange(len(prompt)), d.capture)
    d.add_context(aux, np.arange(len(prompt)))
    out, steps, seq = [int(ids[-1])], [], len(prompt)
    while len(out) < n:
        block = d.draft(out[-1], seq)
        pos = seq + np.arange(d.block)
        pred, aux, _ = t.forward(block, pos, d.capture)
        accepted = 0
        while accepted < d.block - 1 and block[accepted + 1] == pred[accepted]:
            accepted += 1
        commit = min(accepted + 1, n - len(out))
        t.free(pos[commit:])
        if fault == "stale_kv":
            for layer in range(t.layers):
                for P in pos[1:commit]:
                    t.k[layer][int(P)] = t.k[layer][int(pos[0])]
                    t.v[layer][int(P)] = t.v[layer][int(pos[0])]
        d.add_context(aux[:commit], pos[:commit])
        new = [int(x) for x in block[1:accepted + 1]] + [int(pred[accepted])]
        out += new[:commit]
        steps.append(commit)
        seq += commit
    return out, steps
