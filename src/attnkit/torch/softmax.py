"""Softmax that stays finite: an explicit guard for rows with nothing to attend, and the
softmax of scores whose log-sum-exp a fused kernel already computed.

Masked entries are ``-inf``, never a large-negative constant, so half precision cannot
overflow; a row whose every entry is ``-inf`` gets weights 0 and gradient 0 instead of
``0/0``. Statistics run in float32 for half-precision scores (float64 stays float64).
"""

from __future__ import annotations

import torch

from ._dtypes import stats_dtype

__all__ = ["safe_softmax", "softmax_", "softmax_from_lse"]


def safe_softmax(scores: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis; masked entries and rows with no allowed entry give 0.

    Computed in float32 for half-precision scores (float64 stays float64). Masked scores
    become ``-inf``; a row whose maximum is ``-inf`` (everything masked, by ``keep`` or by
    ``-inf`` in the scores) is replaced by zeros *before* the softmax so that neither the
    forward nor the backward pass ever forms ``-inf - (-inf)``: such rows get weight 0 and
    gradient 0. NaN in an allowed position propagates.

    Args:
        scores: ``(..., Tk)``.
        keep: bool, True = keep, broadcastable to ``scores``; None keeps everything.

    Returns:
        Weights in the statistics dtype (float32 or float64), ``scores``' shape.
    """
    s = scores.to(stats_dtype(scores.dtype))
    if s.shape[-1] == 0:
        return s  # no keys: nothing to normalise
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")  # (..., 1)
    s = s.masked_fill(empty, 0.0)
    return torch.softmax(s, dim=-1).masked_fill(empty, 0.0)


class _SoftmaxInPlace(torch.autograd.Function):
    """Softmax over the last axis written into the scores' own buffer, with the guard of
    :func:`safe_softmax` and the exact softmax gradient (only the weights are saved).

    ``max``, ``exp(s - max)``, ``sum``, divide: in place, so the weights take no memory
    beyond the scores they replace. A row whose maximum is ``-inf`` (nothing allowed) is
    rebased by 0 instead (``exp(-inf - 0) = 0``, never ``-inf - (-inf)``) and divided by 1:
    weights 0, gradient 0. NaN in an allowed position gives a NaN row, as it should.
    """

    @staticmethod
    def forward(ctx: object, s: torch.Tensor) -> torch.Tensor:
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(m == float("-inf"), 0.0, m)  # (..., 1): small
        w = s.sub_(m).exp_()
        total = w.sum(dim=-1, keepdim=True)
        w = w.div_(torch.where(total == 0.0, 1.0, total))
        ctx.mark_dirty(w)  # type: ignore[attr-defined]
        ctx.save_for_backward(w)  # type: ignore[attr-defined]
        return w

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        (w,) = ctx.saved_tensors  # type: ignore[attr-defined]
        gw = g * w
        return gw - w * gw.sum(dim=-1, keepdim=True)


def softmax_(s: torch.Tensor) -> torch.Tensor:
    """:func:`safe_softmax` of scores ``s (..., Tk)`` (masked entries already ``-inf``),
    written into ``s``: a buffer the caller owns and no longer needs (never a caller's
    tensor). Differentiable, with the exact gradient; weights of an empty row are 0."""
    if s.shape[-1] == 0:
        return s  # no keys: nothing to normalise (and no maximum to take)
    return _SoftmaxInPlace.apply(s)


class _SoftmaxFromLse(torch.autograd.Function):
    """``exp(s - lse)`` where ``lse = logsumexp(s)`` was computed elsewhere (by the fused
    kernel that produced the output), with the exact softmax gradient.

    The fused kernel already knows each row's log-sum-exp, so the weights cost one pass over
    the scores instead of three (max, sum, divide), done in place in ``s`` (a temporary the
    caller owns). The lse is treated as a constant in the forward but the backward is the
    full softmax Jacobian ``w * (g - sum(g * w))``, so gradients through the returned
    weights are exact.
    """

    @staticmethod
    def forward(ctx: object, s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        # Rows with lse = -inf have every score -inf: exp(-inf - 0) = 0, never NaN.
        lse = lse.masked_fill(lse == float("-inf"), 0.0)
        w = s.sub_(lse[..., None]).exp_()
        ctx.mark_dirty(w)  # type: ignore[attr-defined]
        ctx.save_for_backward(w)  # type: ignore[attr-defined]
        return w

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (w,) = ctx.saved_tensors  # type: ignore[attr-defined]
        gw = g * w
        return gw.sub_(w * gw.sum(dim=-1, keepdim=True)), None


def softmax_from_lse(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Weights ``exp(s - lse)`` of scores ``s (..., Tk)`` given their row log-sum-exp
    ``lse (...)`` (``-inf`` for a row with nothing allowed: weights 0).

    Written in place into ``s``, which must be a buffer the caller owns (never a caller's
    tensor); differentiable with the exact softmax gradient.
    """
    return _SoftmaxFromLse.apply(s, lse)
