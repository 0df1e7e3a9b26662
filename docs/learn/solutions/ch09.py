"""Solutions to the exercises of chapter 9, "Build a GPT"."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.torch import MultiHeadAttention


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with one fused ``qkv`` projection.

    Args:
        embed_dim: ``E``, a multiple of ``num_heads``.
        num_heads: ``H``; each head is ``Dk = E // H`` wide.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, T, E)`` -> ``(B, T, E)``; position ``t`` reads positions ``<= t``."""
        B, T, E = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                       # each (B, H, T, Dk)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        keep = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # True = may attend
        weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        heads = weights @ v                                        # (B, H, T, Dk)
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, E))


class Block(nn.Module):
    """A pre-norm Transformer block (GPT-2, Llama): ``x + attn(ln1(x))``, then
    ``x + mlp(ln2(x))``; ``(B, T, E) -> (B, T, E)``, causal.

    Args:
        embed_dim: ``E``.
        num_heads: ``H``.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = MultiHeadAttention(embed_dim, num_heads)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(),
                                 nn.Linear(4 * embed_dim, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, T, E)`` -> ``(B, T, E)``."""
        a, _ = self.attn(self.ln1(x), causal=True)                # tokens read earlier ones
        x = x + a
        return x + self.mlp(self.ln2(x))                           # each token on its own
