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
from ._nonfinite import zero_rows, zero_rows_
from .masks import causal_mask
from .softmax import sink_column, sink_softmax, softmax_from_lse

__all__ = [
    "attention_weights", "group", "scaled_scores", "softcap_scores", "ungroup",
    "weights_from_lse",
]

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


def softcap_scores(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(s / softcap)`` (logit soft-capping, after the scale and before the
    bias); ``s`` itself when ``softcap`` is None."""
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def _masked_softmax(
    s: torch.Tensor, km: KernelMask, select: bool, softcap: float | None,
    sink: torch.Tensor | None, in_place: bool = False,
) -> torch.Tensor:
    """Weights from scores ``s`` (a buffer the caller owns) under ``km``: ``softcap``,
    then masked entries ``-inf`` by adding ``km.add``, and also by a select when
    ``select`` (a NaN in a masked key may still sit in ``s``: ``nan + -inf`` is NaN); the
    softmax (with ``sink`` in its denominators); empty rows zeroed. ``in_place``: the
    weights overwrite ``s`` (see :func:`attention_weights`)."""
    s = softcap_scores(s, softcap)
    if km.add is not None:
        s = s.add_(km.add)
    if select and km.allowed is not None:
        s = s.masked_fill_(~km.allowed, float("-inf"))
    if not s.shape[-1]:
        return s  # no keys: nothing to normalise
    if in_place:
        w = torch.softmax(s, dim=-1, out=s)
        return w if km.rows is None else zero_rows_(w, km.rows)
    w = torch.softmax(s, dim=-1) if sink is None else sink_softmax(s, sink)
    return w if km.rows is None else zero_rows(w, km.rows)


def attention_weights(
    q: torch.Tensor, k: torch.Tensor, G: int, scale: float, km: KernelMask,
    shape: tuple[int, ...], *, select: bool = False, softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax weights of the scores ``shape = (..., H, Tq, Tk)``, in the statistics dtype,
    under ``km``, with the score variants ``softcap`` and ``sinks (H,)``.

    With autograd: one scores buffer and one weights buffer (the softmax's backward keeps
    the weights). Without, the weights are the only ``Tq x Tk`` allocation. On the CPU
    the softmax then overwrites the scores in place (PyTorch's CPU kernel reads each row
    before it writes it; tests/torch/test_weights.py checks it bit for bit): no second
    buffer, whose page faults on first touch would cost as much as the softmax itself.
    Elsewhere (or with sinks, or while ``torch.compile`` traces) the scores are formed a
    slab of query rows at a time and normalised while in cache.
    """
    Tq = shape[-2]
    per_row = max(1, math.prod(shape) // max(1, Tq))
    rows = max(1, _SLAB_ELEMS // per_row)
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                           for x in (q, k, km.add, sinks))
    sink = None if sinks is None else sink_column(sinks, len(shape))
    if not grad and sink is None and q.device.type == "cpu" \
            and not torch.compiler.is_compiling():
        return _masked_softmax(scaled_scores(q, k, G, scale), km, select, softcap, None,
                               in_place=True)
    if grad or rows >= Tq:
        return _masked_softmax(scaled_scores(q, k, G, scale), km, select, softcap, sink)
    w = torch.empty(shape, dtype=stats_dtype(q.dtype), device=q.device)
    for r0 in range(0, Tq, rows):
        part = KernelMask(*(None if x is None else _rows_of(x, r0, rows) for x in km))
        s = scaled_scores(q[..., r0:r0 + rows, :], k, G, scale)
        w[..., r0:r0 + rows, :] = _masked_softmax(s, part, select, softcap, sink)
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
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention weights ``(..., H, Tq, Tk)`` (statistics dtype) next to a fused kernel's
    output, normalised by the kernel's log-sum-exp (computed here when None).

    Costs one extra ``q k^T`` and one pass over the scores; the scores are built in a single
    buffer (scale, bias and mask applied in place, which autograd allows because nothing
    saved for backward reads them) that becomes the returned weights. When the kernel gave
    no ``lse``, it is computed here (one more pass). ``causal_top_left``: the kernel ran
    with SDPA's own ``is_causal`` (``j <= i``). ``softcap`` is applied to the scores as
    the kernel did.
    """
    s = scaled_scores(q, k, G, scale)  # a fresh buffer: the in-place fills touch no input
    s = softcap_scores(s, softcap)
    if causal_top_left:
        top_left = causal_mask(s.shape[-2], s.shape[-1], alignment="top_left", device=s.device)
        s = s.masked_fill_(~top_left, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill_(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(s.dtype)  # not in place: attn_mask may need a gradient
    if lse is None:
        with torch.no_grad():
            lse = torch.logsumexp(s, dim=-1)
    return softmax_from_lse(s, lse.to(s.dtype))
