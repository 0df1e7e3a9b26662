"""Solutions to the exercises of chapter 3, "Score functions"."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def dot_product_attention(queries: np.ndarray, keys: np.ndarray, values: np.ndarray,
                          valid_lens: np.ndarray) -> np.ndarray:
    """d2l's scaled dot-product attention, in NumPy.

    Args:
        queries: ``(B, Tq, D)``; keys: ``(B, Tk, D)``; values: ``(B, Tk, Dv)``.
        valid_lens: ``(B,)``: for batch row ``b``, keys ``j < valid_lens[b]`` count.

    Returns:
        ``(B, Tq, Dv)``; a batch row with ``valid_len`` 0 gives 0.
    """
    d = queries.shape[-1]
    scores = queries @ np.swapaxes(keys, -1, -2) / np.sqrt(d)     # (B, Tq, Tk)
    keep = np.arange(keys.shape[-2]) < valid_lens[:, None, None]   # (B, 1, Tk): mask the keys
    scores = np.where(keep, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total == 0, 1.0, total)                 # empty row: all 0
    return weights @ values


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention: ``score(q, k) = w_v . tanh(W_q q + W_k k)``.

    Args:
        embed_dim: width of queries, keys and values, ``E``.
        num_hiddens: width ``h`` of the hidden feature of each (query, key) pair.
    """

    def __init__(self, embed_dim: int, num_hiddens: int) -> None:
        super().__init__()
        self.W_q = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.W_k = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                valid_lens: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, Tq, E)``, ``(B, Tk, E)``, ``(B, Tk, E)``, lengths ``(B,)`` -> ``(B, Tq, E)``."""
        features = torch.tanh(self.W_q(queries)[:, :, None, :]     # (B, Tq, 1, h)
                              + self.W_k(keys)[:, None, :, :])     # (B, 1, Tk, h)
        scores = self.w_v(features).squeeze(-1).float()            # (B, Tq, Tk)
        if valid_lens is not None:
            keep = torch.arange(keys.shape[1]) < valid_lens[:, None, None]  # (B, 1, Tk)
            empty = ~keep.any(dim=-1, keepdim=True)                # (B, 1, 1): no key at all
            scores = scores.masked_fill(~keep & ~empty, float("-inf"))
            weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
        return weights.to(values.dtype) @ values
