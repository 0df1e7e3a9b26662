"""Conversion to and from ``torch.nn.MultiheadAttention``.

``nn.MultiheadAttention`` packs the three input projections into ``in_proj_weight``
``(3E, E)`` when ``kdim == vdim == E`` and keeps ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` otherwise; ``in_proj_bias`` ``(3E,)`` and ``out_proj.bias`` exist iff
``bias=True``. Its masks use True = ignore; :func:`attnkit.torch.from_key_padding_mask` and
:func:`attnkit.torch.from_attn_mask` convert them. Its layer is batch-first only when
``batch_first=True``; attnkit's is always batch-first.

Not representable (a ``ValueError`` says so): ``add_bias_kv`` and ``add_zero_attn``
(extra learned/zero key positions), and, in the other direction, GQA or head dims other
than ``E // H``.
"""

from __future__ import annotations

import torch
from torch import nn

from .modules import MultiHeadAttention

__all__ = ["from_torch", "to_torch"]


def from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """An attnkit :class:`MultiHeadAttention` with ``m``'s weights (copied), dtype, device
    and dropout. Same outputs and weights for batch-first inputs."""
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.bias_v is not None:
        raise ValueError("add_bias_kv=True (learned extra key/value) has no attnkit equivalent")
    if m.add_zero_attn:
        raise ValueError("add_zero_attn=True has no attnkit equivalent")
    E, H = m.embed_dim, m.num_heads
    if m._qkv_same_embed_dim:
        w_q, w_k, w_v = m.in_proj_weight.chunk(3, dim=0)
    else:
        w_q, w_k, w_v = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    has_bias = m.in_proj_bias is not None
    if has_bias != (m.out_proj.bias is not None):
        raise ValueError("in_proj_bias and out_proj.bias must both be present or both absent")
    ref = m.out_proj.weight
    ours = MultiHeadAttention(
        E, H, kdim=m.kdim, vdim=m.vdim, bias=has_bias, dropout=m.dropout,
        device=ref.device, dtype=ref.dtype,
    )
    with torch.no_grad():
        ours.q_proj.weight.copy_(w_q)
        ours.k_proj.weight.copy_(w_k)
        ours.v_proj.weight.copy_(w_v)
        ours.out_proj.weight.copy_(m.out_proj.weight)
        if has_bias:
            b_q, b_k, b_v = m.in_proj_bias.chunk(3, dim=0)
            ours.q_proj.bias.copy_(b_q)
            ours.k_proj.bias.copy_(b_k)
            ours.v_proj.bias.copy_(b_v)
            ours.out_proj.bias.copy_(m.out_proj.bias)
    ours.train(m.training)
    return ours


def to_torch(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """An equivalent ``nn.MultiheadAttention(batch_first=True)`` (weights copied)."""
    E, H = m.embed_dim, m.num_heads
    if m.num_kv_heads != H:
        raise ValueError(
            f"nn.MultiheadAttention has no GQA: num_kv_heads={m.num_kv_heads} != num_heads={H}"
        )
    if m.head_dim * H != E or m.v_head_dim != m.head_dim:
        raise ValueError(
            f"nn.MultiheadAttention needs head_dim = v_head_dim = embed_dim // num_heads = "
            f"{E // H}, got head_dim={m.head_dim}, v_head_dim={m.v_head_dim}"
        )
    has_bias = m.q_proj.bias is not None
    ref = m.out_proj.weight
    kdim = None if m.kdim == E else m.kdim
    vdim = None if m.vdim == E else m.vdim
    t = nn.MultiheadAttention(
        E, H, dropout=m.dropout, bias=has_bias, kdim=kdim, vdim=vdim, batch_first=True,
        device=ref.device, dtype=ref.dtype,
    )
    with torch.no_grad():
        if t._qkv_same_embed_dim:
            t.in_proj_weight.copy_(
                torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight], dim=0)
            )
        else:
            t.q_proj_weight.copy_(m.q_proj.weight)
            t.k_proj_weight.copy_(m.k_proj.weight)
            t.v_proj_weight.copy_(m.v_proj.weight)
        t.out_proj.weight.copy_(m.out_proj.weight)
        if has_bias:
            t.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
            t.out_proj.bias.copy_(m.out_proj.bias)
    t.train(m.training)
    return t
