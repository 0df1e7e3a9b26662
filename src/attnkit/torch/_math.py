"""The math path: plain matmuls and a guarded float32 softmax.

The readable baseline of :func:`attnkit.torch.attention`, and the only path that honours
every call (any mask, bias, softcap, sinks, dropout, head layout; double backward
included).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._scores import group, scaled_scores, softcap_scores, ungroup
from .softmax import safe_softmax, sink_column

__all__ = ["empty_attention", "math_path"]


def math_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)`` under the bool mask
    ``keep`` (True = may attend; every constraint already ANDed in). Order: scale,
    ``softcap``, bias, mask, softmax with the ``sinks (H,)`` in its denominators."""
    s = scaled_scores(q, k, G, scale)  # (..., H, Tq, Tk), float32 for half input
    s = softcap_scores(s, softcap)
    if bias is not None:
        s = s + bias.to(s.dtype)
    w = safe_softmax(s, keep, None if sinks is None else sink_column(sinks, s.ndim))
    dropped = F.dropout(w, dropout_p, training=True) if dropout_p > 0.0 else w
    out = ungroup(group(dropped.to(v.dtype), G) @ v, G, q.shape[-2])  # (..., H, Tq, Dv)
    return out, (w.to(q.dtype) if need_weights else None)


def empty_attention(
    q: torch.Tensor, v: torch.Tensor, scores_shape: tuple[int, ...], need_weights: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The result when ``Tq`` or ``Tk`` is 0 (nothing to attend to): zero output, zero
    weights."""
    out = q.new_zeros(scores_shape[:-1] + (v.shape[-1],))
    return out, (q.new_zeros(scores_shape) if need_weights else None)
