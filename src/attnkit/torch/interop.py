"""Conversion to and from ``torch.nn.MultiheadAttention``'s parameter layout.

``nn.MultiheadAttention`` packs the three input projections into ``in_proj_weight``
``(3E, E)`` when ``kdim == vdim == E`` and keeps ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` otherwise; ``in_proj_bias`` ``(3E,)`` and ``out_proj.bias`` exist iff
``bias=True``. Its masks use True = ignore; :func:`attnkit.torch.from_key_padding_mask` and
:func:`attnkit.torch.from_attn_mask` convert them. Its inputs are ``(T, B, E)`` unless
``batch_first=True``; conversions keep ``batch_first`` both ways.

Not representable in attnkit's ``MultiHeadAttention`` (a ``ValueError`` says so):
``add_bias_kv`` and ``add_zero_attn`` (extra learned/zero key positions; the drop-in
:class:`attnkit.torch.MultiheadAttention` has them), and, in the other direction, GQA,
head dims other than ``E // H``, ``softcap`` and ``sinks``.

Conversions allocate the new layer's parameters uninitialised (``nn.utils.skip_init``) and
copy into them, so they draw nothing from torch's global RNG.

This module knows ``nn.MultiheadAttention`` only: :class:`attnkit.torch.MultiHeadAttention`
builds itself from :func:`torch_mha_parts` (its ``from_torch``), and :func:`to_torch` reads
any layer with its attributes.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

__all__ = ["Projections", "batch_major", "to_torch", "torch_mha_parts"]

# Weight (out, in) and bias (or None) of each projection, by the attnkit layer's names.
Projections = dict[str, tuple[torch.Tensor, "torch.Tensor | None"]]


class _Layer(Protocol):
    """What :func:`to_torch` reads of an attnkit ``MultiHeadAttention``."""

    embed_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    kdim: int
    vdim: int
    dropout: float
    batch_first: bool
    training: bool
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    out_proj: nn.Linear


def torch_mha_parts(m: nn.MultiheadAttention) -> tuple[dict[str, Any], Projections]:
    """The constructor arguments of an attnkit ``MultiHeadAttention`` equal to ``m``, and
    ``m``'s projections (views of its parameters, to be copied)."""
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.bias_v is not None:
        raise ValueError("add_bias_kv=True (learned extra key/value) has no attnkit equivalent")
    if m.add_zero_attn:
        raise ValueError("add_zero_attn=True has no attnkit equivalent")
    if m._qkv_same_embed_dim:
        w_q, w_k, w_v = m.in_proj_weight.chunk(3, dim=0)
    else:
        w_q, w_k, w_v = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    has_bias = m.in_proj_bias is not None
    if has_bias != (m.out_proj.bias is not None):
        raise ValueError("in_proj_bias and out_proj.bias must both be present or both absent")
    b_q, b_k, b_v = m.in_proj_bias.chunk(3, dim=0) if has_bias else (None, None, None)
    ref = m.out_proj.weight
    config = dict(
        embed_dim=m.embed_dim, num_heads=m.num_heads, kdim=m.kdim, vdim=m.vdim,
        bias=has_bias, dropout=m.dropout, batch_first=m.batch_first, device=ref.device,
        dtype=ref.dtype,
    )
    projections = {
        "q_proj": (w_q, b_q), "k_proj": (w_k, b_k), "v_proj": (w_v, b_v),
        "out_proj": (m.out_proj.weight, m.out_proj.bias),
    }
    return config, projections


def batch_major(
    query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(T, B, E)`` inputs as ``(B, T, E)`` views (None stays None). A tensor passed twice
    comes back as one tensor, so that ``key is query`` (self-attention) still holds."""
    seen: dict[int, torch.Tensor] = {}

    def swap(x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None:
            return None
        if id(x) not in seen:
            seen[id(x)] = x.transpose(0, 1)
        return seen[id(x)]

    return swap(query), swap(key), swap(value)  # type: ignore[return-value]


def to_torch(m: _Layer) -> nn.MultiheadAttention:
    """An equivalent ``nn.MultiheadAttention`` with ``m``'s ``batch_first`` (weights
    copied, nothing drawn from torch's RNG)."""
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
    softcap, sinks = getattr(m, "softcap", None), getattr(m, "sinks", None)
    if softcap is not None or sinks is not None:
        raise ValueError(
            f"nn.MultiheadAttention has no logit soft-capping or attention sinks: "
            f"softcap={softcap}, sinks={'on' if sinks is not None else 'off'}"
        )
    has_bias = m.q_proj.bias is not None
    ref = m.out_proj.weight
    kdim = None if m.kdim == E else m.kdim
    vdim = None if m.vdim == E else m.vdim
    t = nn.utils.skip_init(
        nn.MultiheadAttention, E, H, dropout=m.dropout, bias=has_bias, kdim=kdim, vdim=vdim,
        batch_first=m.batch_first, device=ref.device, dtype=ref.dtype,
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
