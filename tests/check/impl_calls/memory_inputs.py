"""Cross-attention modules called as ``m(x, memory[, memory_mask])``: the query and one
tensor that is both key and value, as an encoder-decoder's decoder writes it. Read as
``m(query, key, value)``, the mask slot got the value (a false ``call-failed``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderCross(nn.Module):
    """Correct: q from the decoder, a fused k/v projection of the memory, a bool mask
    (True = may attend) given to SDPA."""

    def __init__(self, d_model: int, num_heads: int, scaled: bool = True) -> None:
        super().__init__()
        self.h, self.d, self.scaled = num_heads, d_model // num_heads, scaled
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, Tq, E = x.shape
        Tk = memory.shape[1]
        q = self.q_proj(x).view(B, Tq, self.h, self.d).transpose(1, 2)
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        k = k.view(B, Tk, self.h, self.d).transpose(1, 2)
        v = v.view(B, Tk, self.h, self.d).transpose(1, 2)
        scale = None if self.scaled else 1.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask, scale=scale)
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, E))


class TgtMemory(nn.Module):
    """Correct: separate q/k/v projections, ``forward(tgt, memory, memory_key_padding_mask)``
    (True = padded key), returning the output and the weights; an empty row gives 0."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, tgt, memory, memory_key_padding_mask=None):
        B, Tq, E = tgt.shape
        Tk = memory.shape[1]
        q = self.wq(tgt).view(B, Tq, self.h, self.d).transpose(1, 2)
        k = self.wk(memory).view(B, Tk, self.h, self.d).transpose(1, 2)
        v = self.wv(memory).view(B, Tk, self.h, self.d).transpose(1, 2)
        s = q @ k.transpose(-1, -2) * self.d ** -0.5
        if memory_key_padding_mask is not None:
            s = s.masked_fill(memory_key_padding_mask[:, None, None, :], float("-inf"))
        w = s.softmax(-1).nan_to_num(0.0)  # a query with no key left: weights 0
        return self.wo((w @ v).transpose(1, 2).reshape(B, Tq, E)), w


def unscaled(d_model: int, num_heads: int) -> DecoderCross:
    """Wrong: the scores are never scaled."""
    return DecoderCross(d_model, num_heads, scaled=False)


class SelfWithPosition(nn.Module):
    """Correct DETR-style self-attention: ``forward(src, pos)``, the position embedding
    added to the queries and keys; ``pos`` is no memory to attend to."""

    def __init__(self, d_model: int, nhead: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)

    def forward(self, src, pos, src_key_padding_mask=None):
        q = k = src + pos
        return self.self_attn(q, k, value=src, key_padding_mask=src_key_padding_mask)[0]
