"""The scores ``q k^T * scale`` for every head layout, and attention weights rebuilt from
a fused kernel's log-sum-exp.

GQA is served without repeating K/V: the ``G = H // Hkv`` query heads that share one
key/value head are viewed as one taller matrix (:func:`group`), so one plain matmul
computes all their scores.
"""

from __future__ import annotations

import torch

from ._dtypes import stats_dtype
from .masks import causal_mask
from .softmax import softmax_from_lse

__all__ = ["group", "scaled_scores", "softcap_scores", "ungroup", "weights_from_lse"]


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

    float16 q and k are multiplied in float32: a float16 ``q . k`` overflows to inf past
    65504 (``Dk=64`` entries of 32 suffice) even when the scaled score is small. Only q and
    k are cast; the ``Tq x Tk`` result is wanted in float32 anyway. bfloat16 has float32's
    range, so it keeps its faster half-precision matmul.
    """
    mm = torch.float32 if q.dtype == torch.float16 else q.dtype
    s = ungroup(group(q.to(mm), G) @ k.to(mm).transpose(-1, -2), G, q.shape[-2])
    s = s.to(stats_dtype(s.dtype))  # a no-op unless bfloat16 (then a new float32 buffer)
    return s.mul_(scale)  # in place: the matmul's backward does not read its output


def softcap_scores(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(s / softcap)`` (logit soft-capping, after the scale and before the
    bias); ``s`` itself when ``softcap`` is None."""
    return s if softcap is None else torch.tanh(s / softcap) * softcap


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
    """Attention weights ``(..., H, Tq, Tk)`` (statistics dtype) next to a fused output.

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
