"""Typical wrong answers to the exercises of chapter 2, each with the finding that names it."""

from __future__ import annotations

import math

import numpy as np
import torch


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_fill_in_place(X, valid_lens):
    """d2l's recipe on a reshaped view: the fill lands in the caller's X."""
    flat = X.reshape(-1, X.shape[-1])                    # a view of X
    keep = np.arange(X.shape[-1]) < np.repeat(valid_lens, X.shape[1])[:, None]
    flat[~keep] = -1e6
    return _softmax(flat.reshape(X.shape))


def masked_softmax_fill_minus_1e6(X, valid_lens):
    """A finite fill: -1e6 is -inf in float16, so an empty row is NaN there (and uniform
    in float32)."""
    keep = np.arange(X.shape[-1]) < valid_lens[:, None, None]
    return _softmax(np.where(keep, X, -1e6))


def masked_softmax_no_guard(X, valid_lens):
    """-inf fills, but a row with no key is exp(-inf - -inf) = exp(nan)."""
    keep = np.arange(X.shape[-1]) < valid_lens[:, None, None]
    return _softmax(np.where(keep, X, -np.inf))


def masked_softmax_over_queries(X, valid_lens):
    """The lengths applied to the queries (axis 1), not to the keys."""
    keep = np.arange(X.shape[1])[None, :, None] < valid_lens[:, None, None]
    s = np.where(keep, X, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def attention_masked_inverted(q, k, v, mask):
    """Reads True as "may attend": hides exactly the keys it should see."""
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    empty = (~mask).all(dim=-1, keepdim=True)
    w = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return w.to(v.dtype) @ v


def attention_masked_minus_1e9(q, k, v, mask):
    """The notes' -1e9 fill, in the input's dtype: float16 cannot hold it."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask, -1e9), dim=-1) @ v


def attention_masked_no_guard(q, k, v, mask):
    """-inf fills without a guard: a query with every key hidden gets NaN."""
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1).to(v.dtype) @ v


def attention_masked_in_place(q, k, v, mask):
    """Scaling the caller's query in place (``q.mul_``) before the scores."""
    q.mul_(1 / math.sqrt(q.shape[-1]))
    s = (q @ k.transpose(-2, -1)).float().masked_fill(mask, float("-inf"))
    empty = mask.all(dim=-1, keepdim=True)
    w = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return w.to(v.dtype) @ v


def masked_softmax_per_query_first_length(X, valid_lens):
    """A (B, Tq) reduced to its first column: every query gets query 0's length."""
    lens = valid_lens if valid_lens.ndim == 1 else valid_lens[:, 0]
    keep = np.arange(X.shape[-1]) < lens[:, None, None]
    with np.errstate(invalid="ignore"):  # a length of 0 gives a NaN row as well
        return _softmax(np.where(keep, X, -np.inf))


def masked_softmax_per_query_minus_1e6(X, valid_lens):
    """Right shapes, but a -1e6 fill: a row of length 0 comes out uniform."""
    if valid_lens.ndim == 1:
        valid_lens = np.broadcast_to(valid_lens[:, None], X.shape[:2])
    keep = np.arange(X.shape[-1]) < valid_lens[..., None]
    return _softmax(np.where(keep, X, -1e6))


def masked_softmax_per_query_batch_lens_only(X, valid_lens):
    """Exercise 2.1's answer kept as it was: right for (B,), it cannot broadcast (B, Tq)."""
    keep = np.arange(X.shape[-1]) < valid_lens[:, None, None]
    scores = np.where(keep, X, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


WRONG = [
    ("masked_softmax", masked_softmax_fill_in_place, "mutates-input"),
    ("masked_softmax", masked_softmax_fill_minus_1e6, "float16-overflow"),
    ("masked_softmax", masked_softmax_fill_minus_1e6, "fully-masked-row"),
    ("masked_softmax", masked_softmax_no_guard, "nan-or-inf"),
    ("masked_softmax", masked_softmax_over_queries, "inaccurate"),
    ("masked_softmax_per_query", masked_softmax_per_query_first_length, "inaccurate"),
    ("masked_softmax_per_query", masked_softmax_per_query_minus_1e6, "fully-masked-row"),
    ("masked_softmax_per_query", masked_softmax_per_query_batch_lens_only, "shape"),
    ("attention_masked", attention_masked_inverted, "mask-polarity"),
    ("attention_masked", attention_masked_minus_1e9, "float16-overflow"),
    ("attention_masked", attention_masked_no_guard, "nan-or-inf"),
    ("attention_masked", attention_masked_in_place, "mutates-input"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report, where words that are not code have their Chinese
# after a |): the line to change.
DIAGNOSIS = {
    "masked_softmax_fill_in_place": r"in-place|copy",
    "masked_softmax_fill_minus_1e6": r"-inf|fill",
    "masked_softmax_no_guard": r"guard|empty",
    "masked_softmax_over_queries": r"keys|last axis|最后一个轴",
    "masked_softmax_per_query_first_length": r"per-query|\(B, Tq\)",
    "masked_softmax_per_query_minus_1e6": r"fill|替换",
    "masked_softmax_per_query_batch_lens_only": r"per-query|\(B, Tq\)",
    "attention_masked_inverted": r"other way round|~mask|相反的含义",
    "attention_masked_minus_1e9": r"-1e9|-inf",
    "attention_masked_no_guard": r"guard|empty",
    "attention_masked_in_place": r"in-place|copy",
}
