"""Solutions to the exercises of chapter 8, "Looking at attention"."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def attention_with_weights(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masked scaled dot-product attention that returns the weights it used.

    Args:
        q: ``(..., Tq, Dk)``; k: ``(..., Tk, Dk)``; v: ``(..., Tk, Dv)``.
        mask: bool, broadcastable to ``(..., Tq, Tk)``; True = may attend.

    Returns:
        ``(out (..., Tq, Dv), weights (..., Tq, Tk))``; weights are 0 at hidden keys and
        all 0 for a query with no key.
    """
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total == 0, 1.0, total)
    return weights @ v, weights


class LookingAttention(nn.Module):
    """Self-attention that returns its weights, with dropout on them in training only.

    Args:
        embed_dim: ``E``, a multiple of ``num_heads``.
        num_heads: ``H``.
        dropout: probability of zeroing a weight, in training.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)               # follows .train() / .eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (B, T, E)`` -> ``(out (B, T, E), weights (B, H, T, T))``, the weights taken
        before dropout."""
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        out = self.out_proj((self.dropout(weights) @ v).transpose(1, 2).reshape(B, T, E))
        return out, weights
