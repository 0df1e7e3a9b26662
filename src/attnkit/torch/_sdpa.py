"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention`` with attnkit's
semantics.

SDPA's ``is_causal`` is top-left aligned, so it is used only where that is the call's one
constraint (``causal="top_left"``, or bottom-right with ``Tq == Tk``); otherwise the mask
comes in as ``keep``. Rows with no allowed key are un-masked for the kernel (some backends
return NaN for an empty softmax) and their output zeroed afterwards, so they get zero
gradients. GQA goes through ``enable_gqa``; K and V are never repeated here.

Attention sinks ride along as one more key (:func:`_with_sink_key`): exact, so SDPA's
fused kernels and autograd serve them too.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._scores import weights_from_lse

__all__ = ["sdpa_path"]


def sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    only_causal: bool,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`attnkit.torch._math.math_path`. ``only_causal``: SDPA's own top-left
    ``is_causal`` is exactly the call's one constraint and replaces the mask ``keep``
    (the dispatcher decides; ``keep`` is then None)."""
    causal_top_left = only_causal
    if causal_top_left:
        keep = None
    attn_mask: torch.Tensor | None = None
    empty: torch.Tensor | None = None
    if bias is not None:
        b = _bias_as(bias, q.dtype)
        attn_mask = b if keep is None else b.masked_fill(~keep, float("-inf"))
        if sinks is None:  # with a sink no row is empty: it always sees the sink
            empty = (attn_mask == float("-inf")).all(dim=-1, keepdim=True)
            # Un-mask empty rows for the kernel (its softmax would be 0/0); zeroed below.
            attn_mask = attn_mask.masked_fill(empty, 0.0)
    elif keep is not None:
        if sinks is None:
            empty = ~keep.any(dim=-1, keepdim=True)
            attn_mask = keep | empty
        else:
            attn_mask = keep
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    if sinks is not None:
        q, k, v, attn_mask = _with_sink_key(q, k, v, sinks, scale, attn_mask, causal_top_left)
    gqa = {"enable_gqa": True} if G > 1 else {}

    weights = None
    if not need_weights:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal_top_left,
            scale=scale, **gqa,
        )
    else:
        lse = None
        if (
            q.device.type == "cpu" and q.ndim == 4 and q.shape[-1] == v.shape[-1]
            and dropout_p == 0.0 and not (bias is not None and bias.requires_grad)
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
        ):
            # The CPU flash kernel returns the row log-sum-exp next to the output. It is a
            # private op (what SDPA itself calls on CPU); without it, lse is computed below.
            fmask = attn_mask
            if fmask is not None and fmask.dtype == torch.bool:
                fmask = torch.zeros(fmask.shape, dtype=q.dtype, device=q.device).masked_fill(
                    ~fmask, float("-inf")
                )
            if fmask is not None and fmask.ndim not in (2, 4):  # the op takes 2-D or 4-D
                fmask = fmask.reshape((1,) * (4 - fmask.ndim) + tuple(fmask.shape))
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal_top_left, attn_mask=fmask, scale=scale
            )[:2]
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=causal_top_left, scale=scale, **gqa,
            )
        weights = weights_from_lse(q, k, G, scale, attn_mask, causal_top_left, lse)
        if empty is not None:
            weights = weights.masked_fill(empty, 0.0)
        weights = weights.to(q.dtype)
    if sinks is not None:  # drop the sink's key (and the causal path's extra query)
        out = out[..., -Tq:, :Dv]
        weights = None if weights is None else weights[..., -Tq:, -Tk:]
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out, weights


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
    k = torch.cat([sink_key, torch.nn.functional.pad(k, (0, 1))], dim=-2)
    v_pad = 1 if v.shape[-1] + 1 == k.shape[-1] else 0
    v = torch.nn.functional.pad(v, (0, v_pad, 1, 0))  # a zero value row for the sink
    if attn_mask is not None:
        col = attn_mask.shape[:-1] + (1,)
        first = attn_mask.new_ones(col) if attn_mask.dtype == torch.bool \
            else attn_mask.new_zeros(col)  # allowed, or bias 0
        attn_mask = torch.cat([first, attn_mask], dim=-1)
    return q, k, v, attn_mask


def _bias_as(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` in the kernel's dtype without overflow: finite values beyond float16's
    range saturate at its largest finite value instead of becoming +-inf (which would turn
    "very unlikely" into "excluded" and could empty a row). +-inf stays +-inf."""
    if dtype != torch.float16 or bias.dtype == torch.float16:
        return bias.to(dtype)
    big = torch.finfo(torch.float16).max
    return torch.where(torch.isinf(bias), bias, bias.clamp(-big, big)).to(dtype)
