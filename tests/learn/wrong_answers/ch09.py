"""Typical wrong answers to the exercises of chapter 9, each with the finding that names it."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.torch import MultiHeadAttention


class _CausalSelfAttention(nn.Module):
    """The solution's computation; each subclass brings one bug."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def split(self, x):
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4)

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)

    def masked(self, scores):
        T = scores.shape[-1]
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        return scores.masked_fill(~keep, float("-inf"))

    def merge(self, heads):
        B, H, T, Dk = heads.shape
        return heads.transpose(1, 2).reshape(B, T, H * Dk)

    def forward(self, x):
        q, k, v = self.split(x)
        weights = torch.softmax(self.masked(self.scores(q, k)), dim=-1)
        return self.out_proj(self.merge(weights @ v))


class CausalNoMask(_CausalSelfAttention):
    """The causal mask forgotten: every position reads the future."""

    def masked(self, scores):
        return scores


class CausalNoScale(_CausalSelfAttention):
    """Scores not divided by sqrt(Dk)."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1)


class CausalMergeWithoutTranspose(_CausalSelfAttention):
    """(B, H, T, Dk) reshaped to (B, T, E) without moving H next to Dk: tokens mix."""

    def merge(self, heads):
        B, H, T, Dk = heads.shape
        return heads.reshape(B, T, H * Dk)


class CausalMinus1e9(_CausalSelfAttention):
    """The future filled with -1e9 in the scores' own dtype: float16 overflows."""

    def masked(self, scores):
        T = scores.shape[-1]
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        return scores.masked_fill(~keep, -1e9)


class _Block(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = MultiHeadAttention(embed_dim, num_heads)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(),
                                 nn.Linear(4 * embed_dim, embed_dim))


class BlockPostNorm(_Block):
    """Chapter 0's post-norm layout where pre-norm is asked."""

    def forward(self, x):
        x = self.ln1(x + self.attn(x, causal=True)[0])
        return self.ln2(x + self.mlp(x))


class BlockNotCausal(_Block):
    """Pre-norm, but the attention left bidirectional."""

    def forward(self, x):
        x = x + self.attn(self.ln1(x))[0]
        return x + self.mlp(self.ln2(x))


class BlockNoResidual(_Block):
    """The sublayers' outputs replace x instead of being added to it."""

    def forward(self, x):
        x = self.attn(self.ln1(x), causal=True)[0]
        return self.mlp(self.ln2(x))


class BlockMlpWithoutNorm(_Block):
    """The MLP reads x without ln2 (ln2 made, never used)."""

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)[0]
        return x + self.mlp(x)


WRONG = [
    ("CausalSelfAttention", CausalNoMask, "causal-leak"),
    ("CausalSelfAttention", CausalNoScale, "wrong-scale"),
    ("CausalSelfAttention", CausalMergeWithoutTranspose, "mixes-queries"),
    ("CausalSelfAttention", CausalMinus1e9, "float16-overflow"),
    ("Block", BlockPostNorm, "post-norm"),
    ("Block", BlockNotCausal, "causal-leak"),
    ("Block", BlockNoResidual, "residual"),
    ("Block", BlockMlpWithoutNorm, "residual"),
]

# What each report must say, in English and in Chinese: the line to fix.
DIAGNOSIS = {
    "CausalNoMask": r"masked_fill|tril",
    "CausalNoScale": r"sqrt\(Dk\)",
    "CausalMergeWithoutTranspose": r"transpose\(1, 2\)",
    "CausalMinus1e9": r"-1e9.*-inf",
    "BlockPostNorm": r"x \+ attn\(norm1\(x\)\)",
    "BlockNotCausal": r"causal=True",
    "BlockNoResidual": r"x = x \+ attn\(norm1\(x\)\)",
    "BlockMlpWithoutNorm": r"mlp\(norm2\(x\)\)",
}
