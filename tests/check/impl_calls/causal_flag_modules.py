"""Multi-head modules whose forward takes a causal switch (``causal=`` / ``is_causal=``), as
attnkit's own ``MultiHeadAttention`` does: one that honours it, one that takes it and never
reads it (a look-alike of a flag added to the signature and forgotten in the body); and
the same switch held by the constructor or its config."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


class _Fused(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)

    def attend(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.d).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if causal:
            later = torch.ones(T, T, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(later, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, E))


class HonoursIsCausal(_Fused):
    """``forward(x, is_causal=False)``: causal when asked."""

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        return self.attend(x, is_causal)


class IgnoresCausal(_Fused):
    """``forward(x, causal=False)``: takes the switch, never reads it."""

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        return self.attend(x, False)


class BuiltCausal(_Fused):
    """``BuiltCausal(embed_dim, num_heads, causal=False)``: the switch is the
    constructor's, as a decoder layer built with ``causal=True`` holds it."""

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False) -> None:
        super().__init__(embed_dim, num_heads)
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, self.causal)


@dataclass
class LayerConfig:
    """A config whose ``is_causal`` field says whether the layer masks later positions."""

    n_embd: int = 16
    n_head: int = 4
    is_causal: bool = False


class FromConfigCausal(_Fused):
    """``FromConfigCausal(config)``: the switch is a field of the config."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__(config.n_embd, config.n_head)
        self.is_causal = config.is_causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, self.is_causal)


class BuiltIgnoresCausal(BuiltCausal):
    """Takes ``causal=`` in its constructor and never reads it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, False)
