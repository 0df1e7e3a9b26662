"""Solutions to the exercises of chapter 2, "Masks"."""

from __future__ import annotations

import math

import numpy as np
import torch


def masked_softmax(X: np.ndarray, valid_lens: np.ndarray) -> np.ndarray:
    """d2l's masked softmax: for batch row ``b``, only keys ``j < valid_lens[b]`` count.

    Args:
        X: scores, ``(B, Tq, Tk)``; not changed.
        valid_lens: ``(B,)`` integers.

    Returns:
        ``(B, Tq, Tk)`` weights: 0 past each length; a row with length 0 is all zeros.
    """
    keep = np.arange(X.shape[-1]) < valid_lens[:, None, None]    # (B, 1, Tk): True = count
    scores = np.where(keep, X, -np.inf)                          # a new array; -inf, not -1e6
    m = scores.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)                         # a row with no key
    e = np.exp(scores - m)                                       # exp(-inf) = 0
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)                  # empty row: 0 / 1 = 0


def attention_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention with ``nn.MultiheadAttention``'s mask convention.

    Args:
        q: ``(..., Tq, Dk)``; k: ``(..., Tk, Dk)``; v: ``(..., Tk, Dv)``.
        mask: bool, broadcastable to ``(..., Tq, Tk)``; **True = masked out**.

    Returns:
        ``(..., Tq, Dv)`` in ``v``'s dtype; a query with every key masked gets 0.
    """
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask, float("-inf"))             # -inf fits in every dtype
    empty = mask.all(dim=-1, keepdim=True)                       # queries with no key left
    scores = scores.masked_fill(empty, 0.0)                      # no all -inf row: no NaN
    weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)  # empty row: 0
    return weights.to(v.dtype) @ v


def masked_softmax_per_query(X: np.ndarray, valid_lens: np.ndarray) -> np.ndarray:
    """Masked softmax with d2l's lengths of either shape.

    Args:
        X: scores, ``(B, Tq, Tk)``; not changed.
        valid_lens: ``(B,)`` (one length per batch row) or ``(B, Tq)`` (one per query).

    Returns:
        ``(B, Tq, Tk)`` weights: 0 past each length; a row with length 0 is all zeros.
    """
    B, Tq, Tk = X.shape
    if valid_lens.ndim == 1:
        valid_lens = np.broadcast_to(valid_lens[:, None], (B, Tq))   # the same for each query
    keep = np.arange(Tk) < valid_lens[..., None]                    # (B, Tq, Tk)
    scores = np.where(keep, X, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)
