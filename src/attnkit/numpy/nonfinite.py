"""The masked-NaN guard: NaN/inf in a *masked* position never leaks, in an attended one it
propagates (attnkit's rule on every backend).

A masked weight is exactly 0, but ``0 * nan = nan``: a plain ``p @ v`` would carry a NaN
from a value row no query may see into every output row. Both guards below only do extra
work when a non-finite entry is actually there (the usual case costs one ``isfinite``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["finite_or_zero", "weighted_values"]


def finite_or_zero(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN/inf replaced by 0 (``x`` itself when all finite, the usual case).

    For the operand of a matmul whose other factor is exactly 0 wherever ``x`` is masked:
    ``0 * nan = nan`` would otherwise leak a masked NaN into every result. Where the
    non-finite entry was attended, the other factor (or the caller) carries NaN itself, so
    NaN still flows.
    """
    return x if np.all(np.isfinite(x)) else np.where(np.isfinite(x), x, 0.0)


def weighted_values(
    p: np.ndarray,
    v: np.ndarray,
    keep: np.ndarray | None,
    matmul: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
) -> np.ndarray:
    """``p @ v`` (weights times values) where NaN/inf in a masked value row does not leak.

    Rows of the result that attend a non-finite value (``keep`` True there) keep it; the
    others are recomputed with the non-finite values zeroed.

    Args:
        p: weights ``(..., Tq, Tk)``, exactly 0 where ``keep`` is False.
        v: values ``(..., Tk, Dv)``.
        keep: bool, broadcastable to ``p``; None when nothing is masked (no guard needed).
        matmul: the product to use (attention passes its GQA-grouped matmul).

    Returns:
        ``matmul(p, v)``, ``(..., Tq, Dv)``.
    """
    pv = matmul(p, v)
    if keep is None or np.all(np.isfinite(v)):
        return pv
    bad = ~np.isfinite(v)
    clean = matmul(p, finite_or_zero(v))
    allowed = np.broadcast_to(keep, p.shape).astype(v.dtype)
    touched = matmul(allowed, bad.astype(v.dtype))  # attended non-finite values per row
    return np.where(touched > 0, pv, clean)
