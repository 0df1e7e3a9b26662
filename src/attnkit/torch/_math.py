"""The math path: plain matmuls and a guarded float32 softmax, in one pass.

The readable baseline of :func:`attnkit.torch.attention`, and the only path that honours
every call (any mask, bias, softcap, sinks, dropout, head layout, empty sizes; double
backward included). It is also what ``backend="auto"`` picks where it is the cheaper one:

- ``need_weights=True`` without autograd (or with small scores): the scores are formed
  once, normalised, and multiplied by V; the weights are the one ``Tq x Tk`` buffer (see
  :func:`attnkit.torch._scores.attention_weights`).
- Decoding (a few queries) under a mask: the ``(Tq, Tk)`` scores are small, so masking
  them with a select keeps a NaN in a masked key out for free, and only V needs its
  masked rows zeroed; PyTorch's SDPA would need both. Under a key mask and without
  autograd, weights or variants, its decoding form (:mod:`attnkit.torch._decode`) zeroes
  V's masked rows a cache-sized slab at a time.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._bias import kernel_mask
from ._dtypes import stats_dtype
from ._keep import Keep
from ._nonfinite import guard_inputs, restore, restore_weights
from ._scores import attention_weights, group, ungroup

__all__ = ["math_path"]


def math_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    shape: tuple[int, ...],
    keep: Keep | None,
    bias: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    select: bool = False,
    codes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)`` for scores of
    ``shape`` under ``keep`` and ``bias``. Order: scale, ``softcap``, bias, masks, softmax
    with the ``sinks (H,)`` in its denominators.

    ``select``: mask the scores with a select rather than an addition, so that keys need
    no cleaning (worth it when the scores are smaller than K, i.e. for a few queries).
    ``codes``: k and v come from a KV cache (no NaN/inf; see
    :func:`attnkit.torch._nonfinite.guard_inputs`).
    """
    g = guard_inputs(q, k, v, keep, G, keys_by_select=select, rows_zeroed=True, codes=codes)
    km = kernel_mask(keep, bias, stats_dtype(q.dtype), additive=not select)
    w = attention_weights(g.q, g.k, G, scale, km, shape, select=select, softcap=softcap,
                          sinks=sinks)
    w = restore_weights(w, g.weight_fix, G, keep)
    dropped = F.dropout(w, dropout_p, training=True) if dropout_p > 0.0 else w
    out = ungroup(group(dropped.to(v.dtype), G) @ g.v, G, q.shape[-2])  # (..., H, Tq, Dv)
    out = restore(out, g.out_fix, G)
    return out, (w.to(q.dtype) if need_weights else None)
