"""Merging attention over disjoint key sets by log-sum-exp (NumPy).

Two partial results, each attention over its own key set with its LSE, combine exactly into
attention over the union: ring attention and split-K decoding are built on that, and
:func:`attnkit.numpy.flash_attention` is its special case of one tile at a time. The rule is
:func:`attnkit.spec.merge_by_lse`, shared with the torch twin
(:func:`attnkit.distributed.merge_partials`).
"""

from __future__ import annotations

import numpy as np

from ..spec import merge_by_lse

__all__ = ["merge_partials"]


def merge_partials(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Combine attention over two disjoint key sets into attention over their union.

    Each side's weight is ``exp(lse_side - m)`` with ``m`` the larger LSE, and the output
    is normalised by the sum of the weights (:func:`attnkit.spec.merge_by_lse`, the rule
    ring attention shares): stable at any finite LSE in any dtype, and merging two
    identical partials returns them unchanged. A side with ``lse = -inf`` (no allowed key)
    contributes nothing, and both sides ``-inf`` give output 0 and ``lse = -inf``.

    Args:
        out_a, out_b: ``(..., Tq, Dv)``.
        lse_a, lse_b: ``(..., Tq)``.

    Returns:
        ``(out (..., Tq, Dv), lse (..., Tq))``.
    """
    out_a, out_b = np.asarray(out_a), np.asarray(out_b)
    lse_a, lse_b = np.asarray(lse_a), np.asarray(lse_b)
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(
            f"partials do not match: out_a {out_a.shape}, lse_a {lse_a.shape}, out_b "
            f"{out_b.shape}, lse_b {lse_b.shape}; expected out (..., Tq, Dv), lse (..., Tq)"
        )
    # An empty side's 0 * inf products are discarded by the rule's where(); no warning.
    with np.errstate(invalid="ignore"):
        out, lse = merge_by_lse(out_a, lse_a, out_b, lse_b, np)
    return out.astype(np.result_type(out_a.dtype, out_b.dtype), copy=False), lse
