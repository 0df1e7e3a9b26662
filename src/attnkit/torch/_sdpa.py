"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention`` with attnkit's
semantics.

SDPA's ``is_causal`` is top-left aligned, so it is used only where that is ours
(``Tq == Tk``, causal the only constraint); otherwise the bottom-right mask comes in as
``keep``. Rows with no allowed key are un-masked for the kernel (some backends return NaN
for an empty softmax) and their output zeroed afterwards, so they get zero gradients. GQA
goes through ``enable_gqa``; K and V are never repeated here.
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`attnkit.torch._math.math_path`. ``only_causal``: causal is the sole
    constraint, so for ``Tq == Tk`` SDPA's own ``is_causal`` replaces the mask ``keep``."""
    causal_top_left = only_causal and q.shape[-2] == k.shape[-2]
    if causal_top_left:
        keep = None
    attn_mask: torch.Tensor | None = None
    empty: torch.Tensor | None = None
    if bias is not None:
        b = _bias_as(bias, q.dtype)
        attn_mask = b if keep is None else b.masked_fill(~keep, float("-inf"))
        empty = (attn_mask == float("-inf")).all(dim=-1, keepdim=True)
        # Un-mask empty rows for the kernel (its softmax would be 0/0); zeroed below.
        attn_mask = attn_mask.masked_fill(empty, 0.0)
    elif keep is not None:
        empty = ~keep.any(dim=-1, keepdim=True)
        attn_mask = keep | empty
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
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out, weights


def _bias_as(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` in the kernel's dtype without overflow: finite values beyond float16's
    range saturate at its largest finite value instead of becoming +-inf (which would turn
    "very unlikely" into "excluded" and could empty a row). +-inf stays +-inf."""
    if dtype != torch.float16 or bias.dtype == torch.float16:
        return bias.to(dtype)
    big = torch.finfo(torch.float16).max
    return torch.where(torch.isinf(bias), bias, bias.clamp(-big, big)).to(dtype)
