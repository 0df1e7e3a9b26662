"""Typical wrong answers to the exercises of chapter 3, each with the finding that names it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _masked_softmax(s, valid_lens, fill=-np.inf):
    keep = np.arange(s.shape[-1]) < valid_lens[:, None, None]
    s = np.where(keep, s, fill)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def dot_product_attention_unscaled(queries, keys, values, valid_lens):
    """The 1/sqrt(d) forgotten."""
    return _masked_softmax(queries @ np.swapaxes(keys, -1, -2), valid_lens) @ values


def dot_product_attention_value_width(queries, keys, values, valid_lens):
    """Scaled by sqrt of the values' width."""
    s = queries @ np.swapaxes(keys, -1, -2) / np.sqrt(values.shape[-1])
    return _masked_softmax(s, valid_lens) @ values


def dot_product_attention_fill_minus_1e6(queries, keys, values, valid_lens):
    """d2l's -1e6 fill: a batch row with valid_len 0 averages every value."""
    s = queries @ np.swapaxes(keys, -1, -2) / np.sqrt(queries.shape[-1])
    return _masked_softmax(s, valid_lens, fill=-1e6) @ values


def dot_product_attention_ignores_lens(queries, keys, values, valid_lens):
    """valid_lens accepted and never used."""
    s = queries @ np.swapaxes(keys, -1, -2) / np.sqrt(queries.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ values


class _Additive(nn.Module):
    """The solution's computation, with the bug chosen by the subclasses."""

    fill = float("-inf")

    def __init__(self, embed_dim, num_hiddens):
        super().__init__()
        self.W_q = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.W_k = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def projections(self):
        return self.W_q, self.W_k, self.w_v

    def scores(self, queries, keys):
        W_q, W_k, w_v = self.projections()
        return w_v(torch.tanh(W_q(queries)[:, :, None] + W_k(keys)[:, None])).squeeze(-1)

    def keep(self, queries, keys, valid_lens):
        return torch.arange(keys.shape[1]) < valid_lens[:, None, None]      # (B, 1, Tk)

    def forward(self, queries, keys, values, valid_lens=None):
        s = self.scores(queries, keys).float()
        if valid_lens is not None:
            keep = self.keep(queries, keys, valid_lens)
            empty = ~keep.any(dim=-1, keepdim=True)
            if self.fill == float("-inf"):
                s = s.masked_fill(~keep & ~empty, self.fill)
                w = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
            else:
                w = torch.softmax(s.masked_fill(~keep, self.fill), dim=-1)
        else:
            w = torch.softmax(s, dim=-1)
        return w.to(values.dtype) @ values


class AdditiveAttentionPlainList(_Additive):
    """The three projections kept in a Python list: PyTorch never sees them."""

    def __init__(self, embed_dim, num_hiddens):
        super().__init__(embed_dim, num_hiddens)
        layers = [self.W_q, self.W_k, self.w_v]
        del self.W_q, self.W_k, self.w_v
        self.layers = layers

    def projections(self):
        return self.layers


class AdditiveAttentionFill(_Additive):
    """d2l's -1e6 fill: a batch row with valid_len 0 averages every value."""

    fill = -1e6


class AdditiveAttentionQueryLens(_Additive):
    """The lengths applied to the queries instead of the keys."""

    def keep(self, queries, keys, valid_lens):
        rows = torch.arange(queries.shape[1])[:, None] < valid_lens[:, None, None]  # (B, Tq, 1)
        return rows.expand(-1, -1, keys.shape[1])



class AdditiveAttentionSwappedUnsqueeze(_Additive):
    """The two unsqueezes swapped: the features are (B, Tk, Tq, h), the scores (B, Tk, Tq)."""

    def scores(self, queries, keys):
        W_q, W_k, w_v = self.projections()
        return w_v(torch.tanh(W_q(queries)[:, None] + W_k(keys)[:, :, None])).squeeze(-1)


WRONG = [
    ("dot_product_attention", dot_product_attention_unscaled, "wrong-scale"),
    ("dot_product_attention", dot_product_attention_value_width, "wrong-scale"),
    ("dot_product_attention", dot_product_attention_fill_minus_1e6, "fully-masked-row"),
    ("dot_product_attention", dot_product_attention_ignores_lens, "inaccurate"),
    ("AdditiveAttention", AdditiveAttentionPlainList, "unregistered-parameter"),
    ("AdditiveAttention", AdditiveAttentionFill, "fully-masked-row"),
    ("AdditiveAttention", AdditiveAttentionQueryLens, "inaccurate"),
    ("AdditiveAttention", AdditiveAttentionSwappedUnsqueeze, "shape"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report): the line to change.
DIAGNOSIS = {
    "dot_product_attention_unscaled": r"sqrt\(Dk\)",
    "dot_product_attention_value_width": r"Dv\b",
    "dot_product_attention_fill_minus_1e6": r"fill",
    "dot_product_attention_ignores_lens": r"valid_lens|mask",
    "AdditiveAttentionPlainList": r"ModuleList",
    "AdditiveAttentionFill": r"fill",
    "AdditiveAttentionQueryLens": r"mask",
    "AdditiveAttentionSwappedUnsqueeze": r"unsqueeze|\(B, Tq, Tk",
}
