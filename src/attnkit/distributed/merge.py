"""Merge attention partials over disjoint key sets by their log-sum-exps (torch).

The rule is :func:`attnkit.spec.merge_by_lse`, the one :func:`attnkit.numpy.merge_partials`
uses too: weights ``exp(lse_side - m)`` relative to the larger LSE ``m``, output normalised
by their sum, so the merge is stable at any finite LSE in any dtype and merging identical
partials returns them unchanged. A side with ``lse = -inf`` (no allowed key) contributes
nothing; both sides ``-inf`` give output 0 and ``lse = -inf``; nothing becomes NaN unless an
input already is NaN in an attended position.
"""

from __future__ import annotations

import torch

from ..spec import merge_by_lse

__all__ = ["merge_partials"]


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets into attention over their union.

    Args:
        out_a, out_b: ``(..., Tq, Dv)``.
        lse_a, lse_b: ``(..., Tq)``, natural log, ``-inf`` for a row with no allowed key.

    Returns:
        ``(out (..., Tq, Dv), lse (..., Tq))`` in the promoted dtypes of the inputs.
    """
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(
            f"partials do not match: out_a {tuple(out_a.shape)}, lse_a {tuple(lse_a.shape)}, "
            f"out_b {tuple(out_b.shape)}, lse_b {tuple(lse_b.shape)}; expected out "
            "(..., Tq, Dv), lse (..., Tq)"
        )
    out, lse = merge_by_lse(out_a, lse_a, out_b, lse_b, torch)
    return out.to(torch.promote_types(out_a.dtype, out_b.dtype)), lse
