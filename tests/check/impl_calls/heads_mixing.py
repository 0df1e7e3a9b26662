"""Multi-head modules whose heads are split or merged so that tokens mix, and their
correct twins, for tests/check/test_mixes_queries.py (look-alikes written here).

Every class is built as ``Class(embed_dim, num_heads)``.
"""

import math

import numpy as np
import torch
from torch import nn


class Heads(nn.Module):
    """Correct: split with view(B, T, H, D).transpose(1, 2), merge back with the transpose;
    mask (B, Tq, Tk), True = may attend; an empty row gives 0."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.wq, self.wk = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.wv, self.wo = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)

    def split(self, x):
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d).transpose(1, 2)

    def merge(self, x):
        B, H, T, D = x.shape
        return x.transpose(1, 2).contiguous().view(B, T, H * D)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.split(self.wq(query)), self.split(self.wk(key)), self.split(self.wv(value))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask[:, None], float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        return self.wo(self.merge(w @ v))


class SplitWithoutTranspose(Heads):
    """view(B, H, T, D) straight from (B, T, E): each head gets a stretch of the sequence."""

    def split(self, x):
        B, T, _ = x.shape
        return x.view(B, self.h, T, self.d)


class MergeWithoutTranspose(Heads):
    """(B, H, T, D) viewed as (B, T, E) without moving H back next to D."""

    def merge(self, x):
        B, H, T, D = x.shape
        return x.contiguous().view(B, T, H * D)


class MergeWithoutTransposeByName(MergeWithoutTranspose):
    """The same bug, forward(*, q, k, v, attn_mask=None) by name, True = masked."""

    def forward(self, *, q, k, v, attn_mask=None):
        return super().forward(q, k, v, None if attn_mask is None else ~attn_mask)


class NumpyHeads:
    """A NumPy class: correct when ``mix`` is False; with it, the merge without transpose."""

    mix = False

    def __init__(self, embed_dim, num_heads):
        g = np.random.default_rng(0)
        self.h, self.d = num_heads, embed_dim // num_heads
        self.w = [g.standard_normal((embed_dim, embed_dim)) / math.sqrt(embed_dim)
                  for _ in range(4)]

    def __call__(self, query, key, value):
        B, Tq, E = query.shape
        Tk = key.shape[1]
        q = (query @ self.w[0]).reshape(B, Tq, self.h, self.d).transpose(0, 2, 1, 3)
        k = (key @ self.w[1]).reshape(B, Tk, self.h, self.d).transpose(0, 2, 1, 3)
        v = (value @ self.w[2]).reshape(B, Tk, self.h, self.d).transpose(0, 2, 1, 3)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.d)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        out = (e / e.sum(axis=-1, keepdims=True)) @ v
        out = out.reshape(B, Tq, E) if self.mix else out.transpose(0, 2, 1, 3).reshape(B, Tq, E)
        return out @ self.w[3]


class NumpyMergeWithoutTranspose(NumpyHeads):
    mix = True


class PositionsInsideSelfAttention(Heads):
    """m(x) with a learned position embedding added inside, and the merge without
    transpose: the query-mixing probe is for m(query, key, value) only."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.pos = nn.Parameter(0.1 * torch.randn(64, embed_dim))

    def forward(self, x):
        x = x + self.pos[: x.shape[1]]
        return super().forward(x, x, x)


class ScoresKeysByQueries(Heads):
    """Scores laid out (B, H, Tk, Tq): k @ q^T, then normalised over the queries; runs only
    when Tq = Tk."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.split(self.wq(query)), self.split(self.wk(key)), self.split(self.wv(value))
        s = k @ q.transpose(-2, -1) / math.sqrt(self.d)
        return self.wo(self.merge(torch.softmax(s, dim=-1) @ v))
