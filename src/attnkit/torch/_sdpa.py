"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention`` with attnkit's
semantics.

SDPA's ``is_causal`` is top-left aligned, so it is used only where that is ours
(``Tq == Tk``, causal the only constraint); otherwise the bottom-right mask goes in as a
bool mask (a float one when there is a bias). A row with no allowed key: PyTorch's CPU
kernel returns 0 for it (with zero gradients); elsewhere it is un-masked for the kernel
and zeroed afterwards. GQA goes through ``enable_gqa``; K and V are never repeated here.
NaN/inf in masked positions are kept out by :mod:`attnkit.torch._nonfinite`.

Only public ``torch.nn.functional`` is called; ``need_weights`` computes the weights beside
the kernel (:func:`attnkit.torch._scores.attention_weights`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._bias import kernel_mask
from ._dtypes import stats_dtype
from ._keep import Keep
from ._nonfinite import guard_inputs, restore, zero_rows
from ._scores import attention_weights

__all__ = ["plain_sdpa", "sdpa_path"]


def sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    shape: tuple[int, ...],
    keep: Keep | None,
    bias: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    codes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`attnkit.torch._math.math_path`, with the output from SDPA."""
    is_causal = keep is not None and keep.only_causal and shape[-2] == shape[-1]
    # is_causal masks the scores by a select (a NaN in a future key stays out of the
    # forward); an attn_mask is added, so keys are cleaned for it.
    g = guard_inputs(q, k, v, keep, G, keys_by_select=is_causal, codes=codes)
    on_cpu = q.device.type == "cpu"  # PyTorch's CPU kernels give an empty row 0
    km = kernel_mask(None if is_causal else keep, bias, q.dtype, additive=False,
                     unmask_empty=not on_cpu)
    mask = km.add if km.add is not None else km.allowed
    out = F.scaled_dot_product_attention(
        g.q, g.k, g.v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **({"enable_gqa": True} if G > 1 else {}),
    )
    if km.rows is not None:
        out = zero_rows(out, km.rows)
    out = restore(out, g.out_fix, G)
    if torch.is_grad_enabled() and out.requires_grad:
        out = _FirstOrderOnly.apply(out)
    if not need_weights:
        return out, None
    wkm = kernel_mask(keep, bias, stats_dtype(q.dtype), additive=True)
    w = attention_weights(g.q, g.k, G, scale, wkm, shape, select=is_causal)
    w = restore(w, g.weight_fix, G)
    return out, w.to(q.dtype)


def plain_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: int, scale: float, dropout_p: float
) -> torch.Tensor:
    """SDPA for a call with no mask, no bias and no weights (a decoding step, say): nothing
    to guard, so nothing but the kernel."""
    if G > 1:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale,
                                             enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    if out.requires_grad and torch.is_grad_enabled():
        out = _FirstOrderOnly.apply(out)
    return out


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
