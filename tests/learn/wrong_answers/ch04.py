"""Typical wrong answers to the exercises of chapter 4, each with the finding that names it."""

from __future__ import annotations

import math

import torch
from torch import nn


class _MultiHead(nn.Module):
    """The solution's computation; each subclass brings one bug."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def projections(self):
        return self.q_proj, self.k_proj, self.v_proj, self.out_proj

    def split_heads(self, x):
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x):
        B, H, T, Dk = x.shape
        return x.transpose(1, 2).contiguous().view(B, T, H * Dk)

    def weights(self, scores, mask):
        keep = mask[:, None]
        empty = ~keep.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~keep & ~empty, float("-inf"))
        return torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)

    def forward(self, query, key, value, mask=None):
        q_proj, k_proj, v_proj, out_proj = self.projections()
        q, k, v = (self.split_heads(p(x)) for p, x in ((q_proj, query), (k_proj, key),
                                                       (v_proj, value)))
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.head_dim)
        w = torch.softmax(scores, dim=-1) if mask is None else self.weights(scores, mask)
        return out_proj(self.merge_heads(w.to(v.dtype) @ v))


class MultiHeadPlainList(_MultiHead):
    """The four projections in a Python list (and the output one picked by position)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        linears = [self.q_proj, self.k_proj, self.v_proj, self.out_proj]
        del self.q_proj, self.k_proj, self.v_proj, self.out_proj
        self.linears = linears

    def projections(self):
        return self.linears


class MultiHeadViewWithoutTranspose(_MultiHead):
    """``view(B, H, T, Dk)`` straight from ``(B, T, E)``: the right shape, but each head
    gets a slice of the sequence, not a slice of every token's features."""

    def split_heads(self, x):
        B, T, _ = x.shape
        return x.view(B, self.num_heads, T, self.head_dim)


class MultiHeadMergeWithoutTranspose(_MultiHead):
    """``(B, H, T, Dk)`` reshaped to ``(B, T, E)`` without moving H next to Dk."""

    def merge_heads(self, x):
        B, H, T, Dk = x.shape
        return x.reshape(B, T, H * Dk)


class MultiHeadMinus1e9(_MultiHead):
    """The notes' ``masked_fill(~mask, -1e9)`` on scores in the input's dtype."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split_heads(p(x)) for p, x in ((self.q_proj, query),
                                                       (self.k_proj, key),
                                                       (self.v_proj, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], -1e9)
        return self.out_proj(self.merge_heads(torch.softmax(scores, dim=-1) @ v))


class MultiHeadInvertedMask(_MultiHead):
    """True read as "masked": the keys it may see are the ones hidden."""

    def weights(self, scores, mask):
        return super().weights(scores, ~mask)


class _SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def temperature(self):
        return torch.exp(self.log_temperature)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scale = self.temperature() / math.sqrt(self.head_dim)
        w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, T, E))


class SelfAttentionPlainTensor(_SelfAttention):
    """The temperature as a plain tensor with requires_grad: not a parameter."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.log_temperature = torch.zeros(num_heads, 1, 1, requires_grad=True)


class SelfAttentionUnusedParameter(_SelfAttention):
    """A registered temperature that forward forgets to use."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.log_temperature = nn.Parameter(torch.zeros(num_heads, 1, 1))

    def temperature(self):
        return 1.0


class SelfAttentionListOfParameters(_SelfAttention):
    """One temperature per head, as nn.Parameter, but kept in a plain list."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.log_temperatures = [nn.Parameter(torch.zeros(1, 1)) for _ in range(num_heads)]

    def temperature(self):
        return torch.exp(torch.stack(self.log_temperatures))



class MultiHeadNoScale(_MultiHead):
    """The scores never divided by sqrt(Dk)."""

    def forward(self, query, key, value, mask=None):
        q_proj, k_proj, v_proj, out_proj = self.projections()
        q, k, v = (self.split_heads(p(x)) for p, x in ((q_proj, query), (k_proj, key),
                                                       (v_proj, value)))
        scores = (q @ k.transpose(-2, -1)).float()
        w = torch.softmax(scores, dim=-1) if mask is None else self.weights(scores, mask)
        return out_proj(self.merge_heads(w.to(v.dtype) @ v))


class SelfAttentionFusedNoPermute(_SelfAttention):
    """The fused projection (B, T, 3E) viewed straight as (3, B, H, T, Dk), without the
    permute: each q, k and v takes numbers from other tokens and other batch rows."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.log_temperature = nn.Parameter(torch.zeros(num_heads, 1, 1))

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(3, B, self.num_heads, T, self.head_dim)
        scale = self.temperature() / math.sqrt(self.head_dim)
        w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, T, E))


WRONG = [
    ("MultiHeadAttention", MultiHeadPlainList, "unregistered-parameter"),
    ("MultiHeadAttention", MultiHeadViewWithoutTranspose, "mixes-queries"),
    ("MultiHeadAttention", MultiHeadMergeWithoutTranspose, "mixes-queries"),
    ("MultiHeadAttention", MultiHeadMinus1e9, "float16-overflow"),
    ("MultiHeadAttention", MultiHeadInvertedMask, "mask-polarity"),
    ("SelfAttention", SelfAttentionPlainTensor, "unregistered-parameter"),
    ("SelfAttention", SelfAttentionUnusedParameter, "no-gradient"),
    ("SelfAttention", SelfAttentionListOfParameters, "unregistered-parameter"),
    ("MultiHeadAttention", MultiHeadNoScale, "wrong-scale"),
    ("SelfAttention", SelfAttentionFusedNoPermute, "mixes-queries"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report, where words that are not code have their Chinese
# after a |): the line to change.
DIAGNOSIS = {
    "MultiHeadPlainList": r"ModuleList",
    "MultiHeadViewWithoutTranspose": r"transpose",
    "MultiHeadMergeWithoutTranspose": r"merge|transpose\(1, 2\)\.contiguous",
    "MultiHeadMinus1e9": r"-inf",
    "MultiHeadInvertedMask": r"other way round|相反的含义",
    "MultiHeadNoScale": r"sqrt\(Dk\)",
    "SelfAttentionPlainTensor": r"nn\.Param",
    "SelfAttentionUnusedParameter": r"log_temperature",
    "SelfAttentionListOfParameters": r"ParameterList|nn\.Param",
    "SelfAttentionFusedNoPermute": r"qkv|view|permute",
}
