"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention`` with attnkit's
semantics, and nothing else per call.

The caller (:func:`attnkit.torch.attention`) hands over what SDPA takes: a bool
``attn_mask`` (True = may attend), a float one when there is a bias (``-inf`` where not
allowed), or SDPA's own top-left ``is_causal``. A row with no allowed key comes back as
0 with zero gradients: SDPA does that itself since PyTorch 2.5. GQA goes through
``enable_gqa``; K and V are never repeated here.

Attention sinks ride along as one more key (:func:`_with_sink_key`): exact, so SDPA's
fused kernels and autograd serve them too.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

__all__ = ["bias_as", "first_order_only", "sdpa_path"]


def sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    dropout_p: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out (..., H, Tq, Dv)`` from SDPA; ``attn_mask`` bool or float (in q's dtype);
    ``scale`` None = SDPA's own ``1/sqrt(Dk)``."""
    if sinks is not None:
        Tq, Dv = q.shape[-2], v.shape[-1]
        if scale is None:  # fixed before the sink's feature widens Dk
            scale = 1.0 / math.sqrt(q.shape[-1])
        q, k, v, attn_mask = _with_sink_key(q, k, v, sinks, scale, attn_mask, is_causal)
    # Positional arguments, and keywords only when they differ from SDPA's defaults: a
    # decoding step's whole SDPA call is ~0.1 ms, and parsing keywords shows in it.
    if G > 1:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
                                             scale=scale, enable_gqa=True)
    elif scale is not None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
                                             scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    if sinks is not None:  # drop the sink's key (and the causal path's extra query)
        out = out[..., -Tq:, :Dv]
    return first_order_only(out) if out.requires_grad else out


def first_order_only(out: torch.Tensor) -> torch.Tensor:
    """SDPA's output, marked so that a double backward through it names the path that
    has one (:class:`_FirstOrderOnly`) when autograd records it."""
    return _FirstOrderOnly.apply(out) if torch.is_grad_enabled() else out


def bias_as(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` in the kernel's dtype without overflow: finite values beyond float16's
    range saturate at its largest finite value instead of becoming +-inf (which would turn
    "very unlikely" into "excluded" and could empty a row). +-inf stays +-inf."""
    if dtype != torch.float16 or bias.dtype == torch.float16:
        return bias.to(dtype)
    big = torch.finfo(torch.float16).max
    return torch.where(torch.isinf(bias), bias, bias.clamp(-big, big)).to(dtype)


class _FirstOrderOnly(torch.autograd.Function):
    """Identity on the output of SDPA, whose fused backward has no derivative of its own:
    a backward that builds a graph (``create_graph=True``) stops here with a message that
    says which path has one, instead of PyTorch's internal op name later on."""

    @staticmethod
    def forward(ctx: object, out: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            raise RuntimeError(
                "attnkit.torch.attention: the SDPA path has no double backward (its fused "
                "kernel's backward is not differentiable); for create_graph=True call "
                "attention(..., backend='math')"
            )
        return g


def _with_sink_key(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None,
    causal_top_left: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Attention sinks as one more key, so that SDPA's own kernels take them exactly.

    Every query gets one more feature, its head's sink logit ``z_h``; every key gets a 0
    there; a new first key is 0 everywhere except ``1/scale`` in that feature, with a
    value row of zeros. Its score is ``scale * z_h / scale = z_h`` for every query of head
    ``h`` and the real scores are unchanged, so the softmax over ``Tk + 1`` keys is the
    sink softmax and the output is the same (the sink's value is 0); autograd carries
    ``d z`` through the new feature. The per-head sink sits on the query side, so GQA's
    shared keys serve every head of a group. No row is ever empty (the sink is always
    allowed), and a row whose keys are all masked gets output 0.

    The mask (bool or float) gains an always-allowed first column. With SDPA's top-left
    ``is_causal`` a first query row is added too (it sees only the sink; the caller drops
    its output), so that query ``i`` (now ``i + 1``) keeps seeing keys ``j <= i`` (now
    ``j + 1``) and the sink. ``Dv`` is padded to ``Dk + 1`` when the two were equal, so
    that fused kernels wanting one head dim still apply; the caller slices it off.

    Returns:
        ``(q (..., H, Tq[+1], Dk+1), k (..., Hkv, Tk+1, Dk+1), v (..., Hkv, Tk+1, Dv[+1]),
        attn_mask (..., Tq, Tk+1) or None)``.
    """
    H = q.shape[-3] if q.ndim >= 3 else 1
    z = sinks.to(q.dtype).reshape((H, 1, 1) if q.ndim >= 3 else (1, 1))
    q = torch.cat([q, z.expand(q.shape[:-1] + (1,))], dim=-1)
    if causal_top_left:
        q = torch.cat([q.new_zeros(q.shape[:-2] + (1, q.shape[-1])), q], dim=-2)
    sink_key = k.new_zeros(k.shape[:-2] + (1, k.shape[-1] + 1))
    sink_key[..., -1] = 1.0 / scale
    k = torch.cat([sink_key, F.pad(k, (0, 1))], dim=-2)
    v_pad = 1 if v.shape[-1] + 1 == k.shape[-1] else 0
    v = F.pad(v, (0, v_pad, 1, 0))  # a zero value row for the sink
    if attn_mask is not None:
        col = attn_mask.shape[:-1] + (1,)
        first = attn_mask.new_ones(col) if attn_mask.dtype == torch.bool \
            else attn_mask.new_zeros(col)  # allowed, or bias 0
        attn_mask = torch.cat([first, attn_mask], dim=-1)
    return q, k, v, attn_mask
