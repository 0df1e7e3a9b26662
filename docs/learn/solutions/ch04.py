"""Solutions to the exercises of chapter 4, "Multi-head attention"."""

from __future__ import annotations

import math

import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head attention in the usual PyTorch idiom: four ``nn.Linear``, then
    ``view(B, T, H, Dk).transpose(1, 2)`` to split the heads and
    ``transpose(1, 2).contiguous().view(B, T, E)`` to merge them.

    Args:
        embed_dim: model width ``E``; must be a multiple of ``num_heads`` for the ``view``.
        num_heads: ``H``; each head has width ``Dk = E // H``.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads "
                             f"{num_heads}: view(B, T, H, E // H) needs it")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, E)`` -> ``(B, H, T, Dk)``."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, T, Dk)`` -> ``(B, T, E)``."""
        B, H, T, Dk = x.shape
        return x.transpose(1, 2).contiguous().view(B, T, H * Dk)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """``query (B, Tq, E)``, ``key``/``value (B, Tk, E)``, ``mask (B, Tq, Tk)`` bool with
        **True = may attend** -> ``(B, Tq, E)``; a query with no allowed key gets 0 before
        the output projection."""
        q = self.split_heads(self.q_proj(query))                   # (B, H, Tq, Dk)
        k = self.split_heads(self.k_proj(key))                     # (B, H, Tk, Dk)
        v = self.split_heads(self.v_proj(value))                   # (B, H, Tk, Dk)
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.head_dim)
        if mask is None:
            weights = torch.softmax(scores, dim=-1)
        else:
            keep = mask[:, None]                                   # (B, 1, Tq, Tk): every head
            empty = ~keep.any(dim=-1, keepdim=True)
            scores = scores.masked_fill(~keep & ~empty, float("-inf"))
            weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
        heads = weights.to(v.dtype) @ v                            # (B, H, Tq, Dk)
        return self.out_proj(self.merge_heads(heads))              # (B, Tq, E)


class SelfAttention(nn.Module):
    """Self-attention with one fused ``qkv`` projection and a learned temperature per head.

    Args:
        embed_dim: ``E``, a multiple of ``num_heads``.
        num_heads: ``H``.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # Registered: it trains, moves with .to() and is saved by state_dict().
        self.log_temperature = nn.Parameter(torch.zeros(num_heads, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, T, E)`` -> ``(B, T, E)``."""
        B, T, E = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                       # each (B, H, T, Dk)
        scale = torch.exp(self.log_temperature) / math.sqrt(self.head_dim)  # (H, 1, 1)
        weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        heads = weights @ v                                        # (B, H, T, Dk)
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, E))
