"""Additive (Bahdanau) attention: ``a(q, k) = w_v . tanh(q W_q + k W_k)``, in key chunks.

The ``(..., Tq, Tk, h)`` tanh features are never built whole: scores are computed one key
chunk at a time, forward and backward, so the extra memory is one feature slab plus the
``(..., Tq, Tk)`` scores. Masks, dropout and the fully-masked-row rule are those of
:func:`attnkit.torch.attention`.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..numpy.attention import check_additive
from ..spec import check_dropout
from ._checks import check_bias, check_tensor
from ._dtypes import stats_dtype
from .masks import Window, attention_mask
from .softmax import safe_softmax

__all__ = ["additive_attention", "additive_scores"]


class _AdditiveScores(torch.autograd.Function):
    """``scores[..., i, j] = w_v . tanh(qh[..., i, :] + kh[..., j, :])``, key chunk by key chunk.

    Only one ``(..., Tq, chunk, h)`` slab of tanh features exists at a time, in the forward
    and in the backward (which recomputes the slab instead of storing it, and then turns it
    into the pre-activation gradient in place), so the extra memory is one slab plus
    ``(..., Tq, Tk)`` scores, not ``Tq * Tk * h`` features.
    """

    @staticmethod
    def forward(
        ctx: object, qh: torch.Tensor, kh: torch.Tensor, w_v: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        lead = torch.broadcast_shapes(qh.shape[:-2], kh.shape[:-2])
        Tq, Tk = qh.shape[-2], kh.shape[-2]
        scores = qh.new_empty(lead + (Tq, Tk))
        for j0 in range(0, Tk, chunk):
            feats = qh[..., :, None, :] + kh[..., None, j0:j0 + chunk, :]  # (..., Tq, c, h)
            scores[..., j0:j0 + chunk] = feats.tanh_() @ w_v  # (..., Tq, c)
        ctx.save_for_backward(qh, kh, w_v)  # type: ignore[attr-defined]
        ctx.chunk = chunk  # type: ignore[attr-defined]
        return scores

    @staticmethod
    def backward(
        ctx: object, g: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None]:
        qh, kh, w_v = ctx.saved_tensors  # type: ignore[attr-defined]
        chunk: int = ctx.chunk  # type: ignore[attr-defined]
        Tk, h = kh.shape[-2], kh.shape[-1]
        dqh = torch.zeros(g.shape[:-1] + (h,), dtype=g.dtype, device=g.device)
        dkh = torch.empty(g.shape[:-2] + (Tk, h), dtype=g.dtype, device=g.device)
        dw_v = torch.zeros_like(w_v)
        for j0 in range(0, Tk, chunk):
            j1 = min(j0 + chunk, Tk)
            feats = (qh[..., :, None, :] + kh[..., None, j0:j1, :]).tanh_()  # (..., Tq, c, h)
            gj = g[..., j0:j1]  # (..., Tq, c)
            dw_v += gj.reshape(1, -1).matmul(feats.reshape(-1, h)).reshape(h)
            # d tanh(x) = 1 - tanh(x)^2; the slab becomes the pre-activation gradient.
            dpre = feats.square_().neg_().add_(1.0).mul_(gj[..., None]).mul_(w_v)
            dqh += dpre.sum(dim=-2)
            dkh[..., j0:j1, :] = dpre.sum(dim=-3)
        return _unbroadcast(dqh, qh.shape), _unbroadcast(dkh, kh.shape), dw_v, None


def _unbroadcast(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``grad`` down to ``shape`` (undo broadcasting of leading dims)."""
    while grad.ndim > len(shape):
        grad = grad.sum(dim=0)
    dims = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    return grad.sum(dim=dims, keepdim=True) if dims else grad


def additive_scores(
    qh: torch.Tensor, kh: torch.Tensor, w_v: torch.Tensor, *, chunk_size: int | None = None,
    max_chunk_elements: int = 1 << 22,
) -> torch.Tensor:
    """Additive scores from projected queries ``qh (..., Tq, h)`` and keys ``kh (..., Tk, h)``.

    Args:
        qh: ``(..., Tq, h)``, i.e. ``q @ W_q``.
        kh: ``(..., Tk, h)``, i.e. ``k @ W_k``.
        w_v: ``(h,)``.
        chunk_size: keys per chunk; default: the most that keep one tanh slab
            ``(..., Tq, chunk, h)`` under ``max_chunk_elements``.
        max_chunk_elements: the slab budget (default 4 Mi elements = 16 MiB in float32).

    Returns:
        ``(..., Tq, Tk)`` scores. Extra memory beyond the inputs and result: one feature
        slab ``(..., Tq, chunk, h)`` (plus small per-chunk sums), in the forward and in the
        backward alike.
    """
    lead = torch.broadcast_shapes(qh.shape[:-2], kh.shape[:-2])
    Tq, Tk, h = qh.shape[-2], kh.shape[-2], qh.shape[-1]
    if chunk_size is None:
        per_key = max(1, math.prod(lead) * Tq * h)
        chunk_size = max(1, min(Tk, max_chunk_elements // per_key))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _AdditiveScores.apply(qh, kh, w_v, int(chunk_size))


def additive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: Window | None = None,
    dropout_p: float = 0.0,
    training: bool = True,
    chunk_size: int | None = None,
    max_chunk_elements: int = 1 << 22,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bahdanau attention: score ``a(q, k) = w_v . tanh(q W_q + k W_k)``, in key chunks.

    Weights use the ``x @ W`` layout of :func:`attnkit.numpy.additive_attention`
    (``nn.Linear.weight.T``).

    Args:
        q: ``(..., Tq, Dq)``.
        k: ``(..., Tk, Dk)``.
        v: ``(..., Tk, Dv)``.
        w_q: ``(Dq, h)``.
        w_k: ``(Dk, h)``.
        w_v: ``(h,)``.
        mask, bias, valid_lens, causal, window, dropout_p, training: as in
            :func:`attnkit.torch.attention`.
        chunk_size, max_chunk_elements: see :func:`additive_scores`.

    Returns:
        ``(out (..., Tq, Dv), weights (..., Tq, Tk))``, weights pre-dropout.
    """
    for name, x in zip(("q", "k", "v", "w_q", "w_k", "w_v"), (q, k, v, w_q, w_k, w_v)):
        check_tensor(name, x)
    check_additive(q, k, v, w_q, w_k, w_v)
    lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    dropout_p = check_dropout(dropout_p)
    shape = lead + (q.shape[-2], k.shape[-2])
    check_bias(bias, shape)
    allowed = attention_mask(shape, mask=mask, valid_lens=valid_lens, causal=causal,
                          window=window, device=q.device)
    scores = additive_scores(
        q @ w_q, k @ w_k, w_v, chunk_size=chunk_size, max_chunk_elements=max_chunk_elements
    )
    if bias is not None:
        scores = scores.to(stats_dtype(scores.dtype)) + bias.to(stats_dtype(scores.dtype))
    w = safe_softmax(scores, allowed)
    p = dropout_p if training else 0.0
    dropped = F.dropout(w, p, training=True) if p > 0.0 else w
    return dropped.to(v.dtype) @ v, w.to(q.dtype)
