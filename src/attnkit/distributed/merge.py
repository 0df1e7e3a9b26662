"""Merge attention partials over disjoint key sets by their log-sum-exps (torch).

Same semantics as :func:`attnkit.numpy.merge_partials`: with
``lse = logaddexp(lse_a, lse_b)`` each side carries the share ``exp(lse_side - lse)`` of the
softmax mass, so ``out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b``. A side with
``lse = -inf`` (no allowed key) contributes nothing; both sides ``-inf`` give output 0 and
``lse = -inf``; nothing becomes NaN unless an input already is NaN in an attended position.
"""

from __future__ import annotations

import torch

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
    lse = torch.logaddexp(lse_a, lse_b)  # logaddexp(-inf, -inf) = -inf
    finite = ~torch.isneginf(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    zero = torch.zeros_like(lse)
    w_a = torch.where(finite & ~torch.isneginf(lse_a), torch.exp(lse_a - safe), zero)[..., None]
    w_b = torch.where(finite & ~torch.isneginf(lse_b), torch.exp(lse_b - safe), zero)[..., None]
    # where(), not a bare product: an empty side's output (even NaN) never leaks in.
    out = torch.where(w_a != 0, w_a * out_a, 0.0) + torch.where(w_b != 0, w_b * out_b, 0.0)
    return out.to(torch.promote_types(out_a.dtype, out_b.dtype)), lse
