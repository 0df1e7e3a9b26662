"""Softmax that stays finite: an explicit guard for rows with nothing to attend, and the
softmax of scores whose log-sum-exp a fused kernel already computed.

Masked entries are ``-inf``, never a large-negative constant, so half precision cannot
overflow; a row whose every entry is ``-inf`` gets weights 0 and gradient 0 instead of
``0/0``. Statistics run in float32 for half-precision scores (float64 stays float64).
"""

from __future__ import annotations

import torch

from ._dtypes import stats_dtype

__all__ = ["safe_softmax", "sink_column", "sink_softmax", "softmax_from_lse"]


def sink_column(sinks: torch.Tensor, scores_ndim: int) -> torch.Tensor:
    """``sinks (H,)`` viewed to broadcast as one column against scores ``(..., H, Tq, Tk)``:
    ``(H, 1, 1)``, or ``(1, 1)`` for scores without a head axis (``H = 1``)."""
    return sinks.reshape((-1, 1, 1) if scores_ndim >= 3 else (1, 1))


def safe_softmax(
    scores: torch.Tensor, keep: torch.Tensor | None = None, sink: torch.Tensor | None = None
) -> torch.Tensor:
    """Softmax over the last axis; masked entries and rows with no allowed entry give 0.

    Computed in float32 for half-precision scores (float64 stays float64). Masked scores
    become ``-inf``; a row whose maximum is ``-inf`` (everything masked, by ``keep`` or by
    ``-inf`` in the scores) is replaced by zeros *before* the softmax so that neither the
    forward nor the backward pass ever forms ``-inf - (-inf)``: such rows get weight 0 and
    gradient 0. NaN in an allowed position propagates.

    With ``sink`` (attention sinks, one logit per row or head, broadcastable to
    ``(..., 1)``) the sink joins each denominator as a column with no value:
    ``w_j = exp(s_j) / (sum_k exp(s_k) + exp(z))``; the weights sum to less than 1, and a
    row with no allowed entry still gets zeros (the sink takes all the mass).

    Args:
        scores: ``(..., Tk)``.
        keep: bool, True = keep, broadcastable to ``scores``; None keeps everything.
        sink: the sink logits (:func:`sink_column`), or None.

    Returns:
        Weights in the statistics dtype (float32 or float64), ``scores``' shape.
    """
    s = scores.to(stats_dtype(scores.dtype))
    if s.shape[-1] == 0:
        return s  # no keys: nothing to normalise
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        return sink_softmax(s, sink)
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")  # (..., 1)
    s = s.masked_fill(empty, 0.0)
    return torch.softmax(s, dim=-1).masked_fill(empty, 0.0)


def sink_softmax(s: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """``exp(s_j) / (sum_k exp(s_k) + exp(z))`` over the last axis of scores ``s`` (masked
    entries ``-inf``, statistics dtype) with the sink logits ``sink`` (:func:`sink_column`):
    a row with no allowed entry gets zeros, the sink taking all the mass."""
    z = sink.to(s.dtype)
    # The shift only keeps exp() in range; softmax does not depend on it (detached).
    m = torch.maximum(s.amax(dim=-1, keepdim=True), z).detach()
    m = torch.where(torch.isfinite(m), m, 0.0)  # a -inf sink on an empty row
    e = torch.exp(s - m)  # masked entries: exp(-inf) = 0, gradient 0
    total = e.sum(dim=-1, keepdim=True) + torch.exp(z - m)
    return e / torch.where(total == 0, 1.0, total)


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
