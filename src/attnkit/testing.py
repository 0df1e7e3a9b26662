"""Helpers for judging a backend against the float64 reference (DESIGN.md, "Tests").

A lower-precision result passes when its max error against the float64 reference is at
most ``factor`` times the max error of a plain same-precision math implementation, plus
``atol`` (factor 2 for outputs, 3 for dK/dV, 5 for dQ). NaN where the reference has none
fails, and so does a finite value where it has NaN. The baseline's error is measured where
the baseline is finite, so a NaN in it cannot lift the bound. Failure messages carry max
and mean errors.

Accepts NumPy arrays and anything with ``.detach().cpu()`` (torch tensors), without
importing torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_float64", "assert_close_by_rule", "max_mean_error"]


def as_float64(x: Any) -> np.ndarray:
    """A float64 NumPy copy of an array or tensor (bf16 tensors included)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if hasattr(x, "double"):
            x = x.double()
        x = x.numpy()
    return np.array(x, dtype=np.float64)


def max_mean_error(actual: Any, reference: Any) -> tuple[float, float]:
    """Max and mean absolute error over entries where both are finite and agree on inf."""
    a, r = as_float64(actual), as_float64(reference)
    with np.errstate(invalid="ignore"):  # inf - inf where both agree: zeroed below
        diff = np.abs(a - r)
    same_inf = np.isinf(a) & np.isinf(r) & (np.sign(a) == np.sign(r))
    diff = np.where(same_inf, 0.0, diff)
    if diff.size == 0:
        return 0.0, 0.0
    return float(np.max(diff)), float(np.mean(diff))


def assert_close_by_rule(
    actual: Any,
    reference: Any,
    baseline: Any,
    *,
    factor: float,
    atol: float = 1e-5,
    name: str = "output",
) -> None:
    """Assert ``err(actual) <= factor * err(baseline) + atol`` against the float64 reference.

    Args:
        actual: the result under test.
        reference: the float64 reference result.
        baseline: a plain math implementation's result in the same dtype as ``actual``.
        factor: 2 (outputs), 3 (dK, dV) or 5 (dQ).
        atol: absolute slack.
        name: what is compared, for the message.
    """
    a, r, b = as_float64(actual), as_float64(reference), as_float64(baseline)
    if a.shape != r.shape:
        raise AssertionError(f"{name}: shape {a.shape} != reference shape {r.shape}")
    nan_a, nan_r = np.isnan(a), np.isnan(r)
    if np.any(nan_a & ~nan_r):
        raise AssertionError(
            f"{name}: {int(np.sum(nan_a & ~nan_r))} NaN where the reference has none"
        )
    if np.any(nan_r & ~nan_a):
        raise AssertionError(
            f"{name}: {int(np.sum(nan_r & ~nan_a))} finite where the reference is NaN "
            f"(NaN in an attended position must propagate)"
        )
    inf_bad = np.isinf(a) & ~(np.isinf(r) & (np.sign(a) == np.sign(r)))
    if np.any(inf_bad):
        raise AssertionError(f"{name}: {int(np.sum(inf_bad))} inf where the reference differs")
    ok = ~nan_r
    err_max, err_mean = max_mean_error(a[ok], r[ok])
    # The baseline's error is taken where the baseline is usable: one NaN or wrong inf in
    # it would make the bound NaN or inf, and then any error at all would pass.
    b_ok = ok & ~np.isnan(b) & ~(np.isinf(b) & ~(np.isinf(r) & (np.sign(b) == np.sign(r))))
    base_max, base_mean = max_mean_error(b[b_ok], r[b_ok])
    bound = factor * base_max + atol
    if err_max > bound:
        raise AssertionError(
            f"{name}: max error {err_max:.3e} (mean {err_mean:.3e}) exceeds {factor} x "
            f"baseline {base_max:.3e} (mean {base_mean:.3e}) + {atol:g} = {bound:.3e}"
        )
