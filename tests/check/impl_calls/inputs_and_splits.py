"""Multi-head modules written as people write them, for two things the oracle comparison of
``check_multi_head`` must see: which input each projection reads in ``m(query, key,
value)`` (values projected from the key, keys from the value, the two swapped; a wrapper
that passes the key as the value), and heads split with ``view(B, H, T, d)`` without the
transpose in a self-attention ``m(x)``. With the correct ones that must stay clean:
cross-attention over distinct key and value, ``forward(query, key=None, value=None)``,
and self-attention modules split right (plain, causal, with dropout, rotary, a learned
per-position bias)."""

from __future__ import annotations

import math

import torch
from torch import nn


class CrossRoles(nn.Module):
    """forward(query, key, value) with separate projections; ``k_from`` and ``v_from`` say
    which input the key and value projections read ("key" / "value"): right is
    ``k_from="key", v_from="value"``."""

    def __init__(self, embed_dim, num_heads, k_from="key", v_from="value"):
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.k_from, self.v_from = k_from, v_from

    def forward(self, query, key, value):
        B, Tq, E = query.shape
        inputs = {"key": key, "value": value}
        q = self.q_proj(query).view(B, Tq, self.H, self.d).transpose(1, 2)
        k = self.k_proj(inputs[self.k_from]).view(B, -1, self.H, self.d).transpose(1, 2)
        v = self.v_proj(inputs[self.v_from]).view(B, -1, self.H, self.d).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), dim=-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, Tq, E))


def value_from_key(E, H):
    """The bug: ``v = self.v_proj(key)``: value is never read."""
    return CrossRoles(E, H, v_from="key")


def key_from_value(E, H):
    """The bug: ``k = self.k_proj(value)``: key is never read."""
    return CrossRoles(E, H, k_from="value")


def key_value_swapped(E, H):
    """The bug: ``k = self.k_proj(value)``, ``v = self.v_proj(key)``."""
    return CrossRoles(E, H, k_from="value", v_from="key")


class FusedKVOnKey(nn.Module):
    """The bug: one ``E -> 2E`` projection for k and v, applied to ``key`` (value unused)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.to_q = nn.Linear(embed_dim, embed_dim)
        self.to_kv = nn.Linear(embed_dim, 2 * embed_dim)
        self.to_out = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value):
        B, Tq, E = query.shape
        k, v = self.to_kv(key).chunk(2, dim=-1)
        q = self.to_q(query).view(B, Tq, self.H, self.d).transpose(1, 2)
        k, v = (t.reshape(B, -1, self.H, self.d).transpose(1, 2) for t in (k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(B, Tq, E))


class OptionalKV(nn.Module):
    """Correct: ``forward(query, key=None, value=None)``, self-attention by default."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key=None, value=None):
        key = query if key is None else key
        value = key if value is None else value
        B, Tq, E = query.shape
        q = self.wq(query).view(B, Tq, self.n_heads, self.d_k).transpose(1, 2)
        k = self.wk(key).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        v = self.wv(value).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        w = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).softmax(-1)
        return self.wo((w @ v).transpose(1, 2).reshape(B, Tq, E))


class TorchCross(nn.Module):
    """nn.MultiheadAttention called with (query, key, value); ``value_is_key`` (the bug)
    passes the key as the value."""

    def __init__(self, embed_dim, num_heads, value_is_key=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.value_is_key = value_is_key

    def forward(self, query, key, value):
        out, _ = self.attn(query, key, key if self.value_is_key else value,
                           need_weights=False)
        return out


def torch_value_is_key(E, H):
    return TorchCross(E, H, value_is_key=True)


class SplitNoTranspose(nn.Module):
    """Self-attention ``m(x)`` whose heads are split with ``view(B, H, T, d)`` (the bug:
    the transpose from (B, T, H, d) is missing); ``merge``: "transpose" (merged back with
    ``transpose(1, 2).reshape``) or "view" (``view(B, T, E)`` straight); ``fused``: one
    ``E -> 3E`` projection chunked into q, k, v; ``causal``: a causal mask; ``split``
    "transpose" splits right (then only a merge by "view" is wrong)."""

    def __init__(self, d_model, n_heads, merge="transpose", fused=False, causal=False,
                 split="view"):
        super().__init__()
        self.H, self.d = n_heads, d_model // n_heads
        if fused:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        else:
            self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.o = nn.Linear(d_model, d_model)
        self.merge, self.fused, self.causal, self.split = merge, fused, causal, split

    def forward(self, x):
        B, T, E = x.shape
        parts = self.qkv(x).chunk(3, -1) if self.fused else (self.q(x), self.k(x), self.v(x))
        if self.split == "view":
            q, k, v = (p.reshape(B, self.H, T, self.d) for p in parts)
        else:
            q, k, v = (p.reshape(B, T, self.H, self.d).transpose(1, 2) for p in parts)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if self.causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out = s.softmax(-1) @ v
        out = out.transpose(1, 2).reshape(B, T, E) if self.merge == "transpose" else \
            out.reshape(B, T, E)
        return self.o(out)


def split_and_merge_no_transpose(E, H):
    return SplitNoTranspose(E, H, merge="view")


def fused_split_no_transpose(E, H):
    return SplitNoTranspose(E, H, fused=True)


def causal_split_no_transpose(E, H):
    return SplitNoTranspose(E, H, causal=True)


def merge_no_transpose(E, H):
    """Split right, merged with ``view(B, T, E)`` straight from (B, H, T, d)."""
    return SplitNoTranspose(E, H, merge="view", split="transpose")


class SelfRight(nn.Module):
    """Correct self-attention ``m(x)``, split ``(B, T, H, d)`` then transposed; ``causal``,
    ``dropout`` (on the weights, off in eval), ``pos_bias`` (a learned bias per pair of
    positions added to the scores: not permutation equivariant, and right)."""

    def __init__(self, d_model, n_heads, causal=False, dropout=0.0, pos_bias=False,
                 max_len=16):
        super().__init__()
        self.H, self.d = n_heads, d_model // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.drop = nn.Dropout(dropout)
        self.causal = causal
        self.pos = nn.Parameter(0.5 * torch.randn(n_heads, max_len, max_len)) if pos_bias \
            else None

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, self.H, self.d).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if self.pos is not None:
            s = s + self.pos[:, :T, :T]
        if self.causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out = self.drop(s.softmax(-1)) @ v
        return self.o(out.transpose(1, 2).reshape(B, T, E))


def self_causal(E, H):
    return SelfRight(E, H, causal=True)


def self_dropout(E, H):
    return SelfRight(E, H, dropout=0.1)


def self_position_bias(E, H):
    return SelfRight(E, H, pos_bias=True)
