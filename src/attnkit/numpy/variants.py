"""Two score modifiers of today's model families, forward and backward: logit soft-capping
(Gemma 2, Grok) and attention sinks (GPT-OSS, StreamingLLM).

Order on every backend: ``scale``, then ``softcap``, then bias/ALiBi, then
masks; the sinks join the softmax last.

**softcap** ``c``: ``s -> c * tanh(s / c)`` bounds every score to ``(-c, c)``. Its
derivative is ``1 - tanh(s / c)^2``, so the backward multiplies the scores' gradient by
that (:func:`softcap_backward`).

**sinks**: one logit ``z_h`` per query head, a column with no value in each softmax
denominator::

    L   = log(sum_j exp(s_j) + exp(z))     (the row's LSE, the sink included)
    w_j = exp(s_j - L)                     (sum_j w_j = 1 - exp(z - L) < 1)
    out = sum_j w_j v_j

The weights no longer sum to 1: part of the mass goes to "nothing". A row whose keys are
all masked gives weights 0 and output 0, as without sinks, and its LSE is ``z`` (the sink
takes all the mass). Backward: the sink column has no value, so its ``dw`` is 0 and the
softmax backward of the real columns is unchanged, ``ds_j = w_j (dw_j - sum_k w_k dw_k)``;
the sink gets ``dz = -w_z sum_k w_k dw_k`` with ``w_z = exp(z - L)``, summed over every row
of its head (:func:`sinks_backward`). ``sum_k w_k dw_k`` is ``dO . O`` for ``O = w V``.
"""

from __future__ import annotations

import numpy as np

from ..spec import check_sinks
from .groups import sum_to_shape
from .softmax import compute_dtype

__all__ = ["sink_column", "sink_softmax", "sinks_backward", "softcap_backward", "softcap_scores"]


def softcap_scores(
    scores: np.ndarray, softcap: float | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(softcap * tanh(scores / softcap), tanh(scores / softcap))``; the scores
    unchanged and None when ``softcap`` is None. The tanh is what the backward needs."""
    if softcap is None:
        return scores, None
    t = np.tanh(scores / scores.dtype.type(softcap))
    return t * t.dtype.type(softcap), t


def softcap_backward(d_capped: np.ndarray, tanh: np.ndarray | None) -> np.ndarray:
    """VJP of :func:`softcap_scores`: ``d_scores = d_capped * (1 - tanh^2)``."""
    return d_capped if tanh is None else d_capped * (1.0 - tanh * tanh)


def sink_column(sinks: np.ndarray, scores_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``sinks (H,)`` shaped to broadcast as one column against scores ``(..., H, Tq, Tk)``:
    ``(H, 1, 1)`` (``(1, 1)`` for scores without a head axis, ``H = 1``)."""
    H = scores_shape[-3] if len(scores_shape) >= 3 else 1
    check_sinks(sinks, H)
    z = np.asarray(sinks).astype(dtype, copy=False)
    return z.reshape((H, 1, 1) if len(scores_shape) >= 3 else (1, 1))


def sink_softmax(scores: np.ndarray, sink: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax over the last axis with the value-less sink logit in each denominator.

    Args:
        scores: ``(..., Tq, Tk)``, masked entries ``-inf``.
        sink: broadcastable to ``(..., Tq, 1)`` (:func:`sink_column`).

    Returns:
        ``(weights (..., Tq, Tk), sink_weight (..., Tq, 1), lse (..., Tq, 1))`` in the
        compute dtype: ``w_j = exp(s_j - L)``, ``w_z = exp(z - L)``, ``L`` the LSE with the
        sink. A fully masked row gets weights 0, ``w_z = 1`` and ``L = z``.
    """
    s = np.asarray(scores)
    s = s.astype(compute_dtype(s.dtype), copy=False)
    z = np.broadcast_to(sink.astype(s.dtype, copy=False), s.shape[:-1] + (1,))
    m = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), z)
    m = np.where(np.isfinite(m), m, 0.0).astype(s.dtype, copy=False)  # -inf sink, empty row
    e = np.exp(s - m)
    e_z = np.exp(z - m)
    total = np.sum(e, axis=-1, keepdims=True) + e_z
    w = np.divide(e, total, out=np.zeros_like(e), where=total != 0)
    w_z = np.divide(e_z, total, out=np.zeros_like(e_z), where=total != 0)
    with np.errstate(divide="ignore"):
        lse = np.log(total) + m
    return w, w_z, lse


def sinks_backward(sink_weight: np.ndarray, row_term: np.ndarray, H: int) -> np.ndarray:
    """Gradient of the sinks ``(H,)``: ``dz_h = -sum w_z * rowsum(w * dw)`` over every row
    of head ``h``.

    Args:
        sink_weight: ``w_z``, ``(..., H, Tq, 1)`` (or ``(Tq, 1)`` without a head axis).
        row_term: ``sum_k w_k dw_k`` per row, same shape (``dO . O`` for ``O = w V``).
        H: query heads (1 without a head axis).
    """
    per_row = -(sink_weight * row_term)
    if per_row.ndim < 3:
        return np.atleast_1d(np.sum(per_row)).reshape(1)
    return sum_to_shape(per_row, (H, 1, 1)).reshape(H)
