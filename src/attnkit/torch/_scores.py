"""The scores ``q k^T * scale`` for every head layout, and the attention weights built
from them.

GQA is served without repeating K/V: the ``G = H // Hkv`` query heads that share one
key/value head are viewed as one taller matrix (:func:`group`), so one plain matmul
computes all their scores.
"""

from __future__ import annotations

import math

import torch

from ._bias import KernelMask
from ._dtypes import stats_dtype
from ._nonfinite import zero_rows
from .masks import causal_mask
from .softmax import softmax_from_lse

__all__ = ["attention_weights", "group", "scaled_scores", "ungroup", "weights_from_lse"]

# Without autograd, the weights are built in slabs of query rows holding about this many
# scores, so that a slab's scores and softmax stay in cache and only the weights
# themselves take (..., H, Tq, Tk) memory.
_SLAB_ELEMS = 1 << 18


def group(x: torch.Tensor, G: int) -> torch.Tensor:
    """``(..., H, T, X)`` as ``(..., Hkv, G*T, X)``: the G query heads sharing one key/value
    head become one taller matrix, so a plain matmul serves GQA without repeating K/V."""
    if G == 1:
        return x
    *lead, H, T, X = x.shape
    return x.reshape(*lead, H // G, G * T, X)


def ungroup(x: torch.Tensor, G: int, T: int) -> torch.Tensor:
    """Inverse of :func:`group`: ``(..., Hkv, G*T, X)`` to ``(..., H, T, X)``."""
    if G == 1:
        return x
    *lead, Hkv, _, X = x.shape
    return x.reshape(*lead, Hkv * G, T, X)


def scaled_scores(q: torch.Tensor, k: torch.Tensor, G: int, scale: float) -> torch.Tensor:
    """Scaled scores ``(..., H, Tq, Tk)`` in the statistics dtype, in a buffer of their own.

    Half-precision q and k are multiplied in float32: a float16 ``q . k`` overflows to inf
    past 65504 (``Dk=64`` entries of 32 suffice), and bfloat16 scores carry 8 bits, so
    weights normalised from them would not sum to 1 within 1e-2. Only q and k are cast;
    the ``Tq x Tk`` result is wanted in float32 anyway.
    """
    dt = stats_dtype(q.dtype)
    s = ungroup(group(q.to(dt), G) @ k.to(dt).transpose(-1, -2), G, q.shape[-2])
    return s.mul_(scale)  # in place: the matmul's backward does not read its output


def _masked_softmax(s: torch.Tensor, km: KernelMask, select: bool) -> torch.Tensor:
    """Weights from scores ``s`` (a buffer the caller owns) under ``km``: masked entries
    ``-inf``, by adding ``km.add``, then also by a select when ``select`` (a NaN in a
    masked key may still sit in ``s``: ``nan + -inf`` is NaN); empty rows zeroed."""
    if km.add is not None:
        s = s.add_(km.add)
    if select and km.allowed is not None:
        s = s.masked_fill_(~km.allowed, float("-inf"))
    w = torch.softmax(s, dim=-1) if s.shape[-1] else s
    return w if km.rows is None else zero_rows(w, km.rows)


def attention_weights(
    q: torch.Tensor, k: torch.Tensor, G: int, scale: float, km: KernelMask,
    shape: tuple[int, ...], *, select: bool = False,
) -> torch.Tensor:
    """Softmax weights of the scores ``shape = (..., H, Tq, Tk)``, in the statistics dtype,
    under ``km``.

    With autograd: one scores buffer and one weights buffer (the softmax's backward keeps
    the weights). Without: the weights are the only ``Tq x Tk`` allocation; the scores are
    formed a slab of query rows at a time and normalised while in cache.
    """
    Tq = shape[-2]
    per_row = max(1, math.prod(shape) // max(1, Tq))
    rows = max(1, _SLAB_ELEMS // per_row)
    grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or (km.add is not None and km.add.requires_grad))
    if grad or rows >= Tq:
        return _masked_softmax(scaled_scores(q, k, G, scale), km, select)
    w = torch.empty(shape, dtype=stats_dtype(q.dtype), device=q.device)
    for r0 in range(0, Tq, rows):
        part = KernelMask(*(None if x is None else _rows_of(x, r0, rows) for x in km))
        s = scaled_scores(q[..., r0:r0 + rows, :], k, G, scale)
        w[..., r0:r0 + rows, :] = _masked_softmax(s, part, select)
    return w


def _rows_of(x: torch.Tensor, r0: int, n: int) -> torch.Tensor:
    """Query rows ``[r0, r0 + n)`` of a mask that broadcasts over them or has them."""
    return x if x.ndim < 2 or x.shape[-2] == 1 else x[..., r0:r0 + n, :]


def weights_from_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    G: int,
    scale: float,
    attn_mask: torch.Tensor | None,
    causal_top_left: bool,
    lse: torch.Tensor | None,
) -> torch.Tensor:
    """Attention weights ``(..., H, Tq, Tk)`` (statistics dtype) next to a fused kernel's
    output, normalised by the kernel's log-sum-exp (computed here when None).

    Costs one extra ``q k^T`` and one pass over the scores; the scores are built in a single
    buffer (scale, bias and mask applied in place, which autograd allows because nothing
    saved for backward reads them) that becomes the returned weights. ``causal_top_left``
    is only set for ``Tq == Tk``, where the top-left diagonal is the bottom-right one.
    """
    s = scaled_scores(q, k, G, scale)  # a fresh buffer: the in-place fills touch no input
    if causal_top_left:
        s = s.masked_fill_(~causal_mask(s.shape[-2], s.shape[-1], device=s.device), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill_(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(s.dtype)  # not in place: attn_mask may need a gradient
    if lse is None:
        with torch.no_grad():
            lse = torch.logsumexp(s, dim=-1)
    return softmax_from_lse(s, lse.to(s.dtype))
