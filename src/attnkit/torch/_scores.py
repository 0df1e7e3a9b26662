"""The scores ``q k^T * scale`` for every head layout, and the attention weights built
from them.

GQA is served without repeating K/V: the ``G = H // Hkv`` query heads that share one
key/value head are viewed as one taller matrix (:func:`group`), so one plain matmul
computes all their scores.
"""

from __future__ import annotations

import torch

from ._dtypes import stats_dtype
from .masks import causal_mask
from .softmax import sink_column, sink_softmax, softmax_from_lse

__all__ = [
    "additive_mask", "attention_weights", "group", "scaled_scores", "softcap_scores",
    "ungroup", "weights_from_lse", "weights_mask",
]


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


def weights_mask(
    allowed: torch.Tensor | None, rows: torch.Tensor | None, need_weights: bool
) -> torch.Tensor | None:
    """Where weights may be nonzero: the rows that have a key, and, when the weights are
    returned, only the allowed keys of those rows."""
    if not need_weights or allowed is None:
        return rows
    return allowed if rows is None else allowed & rows


def additive_mask(
    allowed: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype,
    *, empty_rows: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(add, rows)`` for scores in ``dtype``: ``add`` is the bias with ``-inf`` where
    ``allowed`` is False (None without either); ``rows (..., Tq|1, 1)`` is False for a
    query with no allowed key (None when ``empty_rows`` is False: none can be empty).

    An empty row would be a ``0/0`` softmax whose backward is NaN, so its ``add`` is 0
    (the row is un-masked for the softmax) and the caller zeroes its weights afterwards:
    weights 0, output 0, gradient 0. Both tensors have the masks' shape, never more."""
    if allowed is None and bias is None:
        return None, None
    add = torch.zeros((), dtype=dtype, device=(allowed if bias is None else bias).device) \
        if bias is None else bias.to(dtype)
    if allowed is not None:
        add = torch.where(allowed, add, float("-inf"))
    if not empty_rows:
        return add, None
    rows = (add != float("-inf")).any(dim=-1, keepdim=True)
    return torch.where(rows, add, 0.0), rows


def attention_weights(
    q: torch.Tensor, k: torch.Tensor, G: int, scale: float, add: torch.Tensor | None,
    allowed: torch.Tensor | None, *, softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax weights ``(..., H, Tq, Tk)`` in the statistics dtype: scale, ``softcap``,
    ``add`` (:func:`additive_mask`), softmax (with the ``sinks (H,)`` in its
    denominators), then 0 wherever ``allowed`` (bool, broadcastable) is False: the rows with
    no key, and, for weights a caller reads, every masked key (a NaN score among a row's
    allowed keys makes its whole softmax NaN).

    Without autograd on the CPU the softmax overwrites the scores in place (PyTorch's CPU
    kernel reads each row before it writes it; tests/torch/test_weights.py checks it bit
    for bit): the weights are the one ``Tq x Tk`` buffer, with no second one whose page
    faults on first touch would cost as much as the softmax itself."""
    s = softcap_scores(scaled_scores(q, k, G, scale), softcap)
    if add is not None:
        s = s.add_(add)
    if not s.shape[-1]:
        return s  # no keys: nothing to normalise
    if sinks is not None:
        w = sink_softmax(s, sink_column(sinks, s.ndim))
    elif q.device.type == "cpu" and not torch.compiler.is_compiling() and not (
            torch.is_grad_enabled() and s.requires_grad):
        w = torch.softmax(s, dim=-1, out=s)
    else:
        w = torch.softmax(s, dim=-1)
    if allowed is None:
        return w
    return w.masked_fill(~allowed, 0.0) if w.requires_grad else w.masked_fill_(~allowed, 0.0)


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
    w = softmax_from_lse(s, lse.to(s.dtype))
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # a NaN LSE: 0 stays 0
        w = w.masked_fill(~attn_mask, 0.0)
    return w
