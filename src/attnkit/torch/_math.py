"""The math path: plain matmuls and a float32 softmax, in one pass.

The readable baseline of :func:`attnkit.torch.attention`, and the only path that honours
every call (any mask, bias, softcap, sinks, dropout, head layout, empty sizes; double
backward included). ``backend="auto"`` also picks it for ``need_weights=True`` where one
pass is cheaper than a fused kernel plus the weights beside it: the scores are formed
once, normalised, and multiplied by V, and the weights are the one ``Tq x Tk`` buffer.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._dtypes import stats_dtype
from ._scores import additive_mask, attention_weights, group, ungroup, weights_mask

__all__ = ["math_path"]


def math_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    empty_rows: bool,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)`` under the bool mask
    ``allowed`` (True = may attend) and ``bias``. Order: scale, ``softcap``, bias, masks,
    softmax with the ``sinks (H,)`` in its denominators. ``empty_rows``: some query may
    have no allowed key (its weights are then zeroed; with sinks no row is empty)."""
    add, rows = additive_mask(allowed, bias, stats_dtype(q.dtype),
                              empty_rows=empty_rows and sinks is None)
    allowed = weights_mask(allowed, rows, need_weights)
    w = attention_weights(q, k, G, scale, add, allowed, softcap=softcap, sinks=sinks)
    dropped = F.dropout(w, dropout_p, training=True) if dropout_p > 0.0 else w
    out = ungroup(group(dropped.to(v.dtype), G) @ v, G, q.shape[-2])  # (..., H, Tq, Dv)
    return out, (w.to(q.dtype) if need_weights else None)
