"""The shared dtype rules of :mod:`attnkit.spec`, as torch dtypes."""

from __future__ import annotations

import torch

from ..spec import stats_dtype_name

__all__ = ["stats_dtype"]


def stats_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype softmax statistics (max, sum, LSE) run in for inputs of ``dtypes``: float32
    for half precision and float32, float64 for float64 (of their promoted dtype)."""
    promoted = dtypes[0]
    for dt in dtypes[1:]:
        promoted = torch.promote_types(promoted, dt)
    return getattr(torch, stats_dtype_name(promoted))
