"""Masks and bias as what a kernel takes: one additive term, and the rows it empties.

A kernel (SDPA, or the math path's ``softmax``) sees ``scores + add``: the bias where a
key is allowed, ``-inf`` where it is not. A query row with no allowed key at all (by the
masks, or a bias of ``-inf`` throughout) would be a ``0/0`` softmax, so such rows are
*un-masked* for the kernel (``add = 0``) and their results zeroed afterwards
(:func:`attnkit.torch._nonfinite.zero_rows`): the kernel never sees an empty softmax, and
the row gets weights 0, output 0 and gradient 0 (the zeroing passes none back). Every
tensor here has the small shape of the masks and bias, never ``(..., H, Tq, Tk)`` unless
they do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._keep import Keep

__all__ = ["KernelMask", "kernel_mask"]


class KernelMask(NamedTuple):
    """What one call's masks and bias become for a kernel (all broadcastable to the
    scores ``(..., Tq, Tk)``).

    ``allowed``: bool, True = may attend, empty rows un-masked (None: all allowed).
    ``add``: float, ``bias`` with ``-inf`` where not allowed, empty rows 0 (None: no bias
    and no mask). ``rows``: bool ``(..., Tq|1, 1)``, False for a row with no allowed key,
    to zero afterwards (None: every row has one).
    """

    allowed: torch.Tensor | None
    add: torch.Tensor | None
    rows: torch.Tensor | None


def kernel_mask(
    keep: Keep | None, bias: torch.Tensor | None, dtype: torch.dtype, *, additive: bool,
    unmask_empty: bool = True,
) -> KernelMask:
    """The masks of ``keep`` and the ``bias`` for a kernel computing in ``dtype``.

    ``additive``: build ``add`` even without a bias (for a kernel that adds its mask);
    otherwise a bool ``allowed`` alone serves a bias-free call. ``unmask_empty=False``: the
    kernel itself gives empty rows 0 (PyTorch's CPU SDPA does), so they stay masked and
    ``rows`` is None.
    """
    allowed = None if keep is None else keep.full()
    if bias is None and allowed is None:
        return KernelMask(None, None, None)
    if bias is None and not additive:
        assert allowed is not None
        rows = keep.rows() if unmask_empty else None
        if rows is None:
            return KernelMask(allowed, None, None)
        return KernelMask(allowed | ~rows, None, rows)
    if bias is None:
        assert keep is not None
        add = torch.zeros((), dtype=dtype, device=keep.device)
    else:
        add = _bias_as(bias, dtype)
    if allowed is not None:
        add = torch.where(allowed, add, float("-inf"))
    if not unmask_empty:
        return KernelMask(allowed, add, None)
    rows = (add > float("-inf")).any(dim=-1, keepdim=True)
    add = torch.where(rows, add, 0.0)
    return KernelMask(None if allowed is None else allowed | ~rows, add, rows)


def _bias_as(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` in the kernel's dtype without overflow: finite values beyond float16's
    range saturate at its largest finite value instead of becoming +-inf (which would turn
    "very unlikely" into "excluded" and could empty a row). +-inf stays +-inf."""
    if dtype != torch.float16 or bias.dtype == torch.float16:
        return bias.to(dtype)
    big = torch.finfo(torch.float16).max
    return torch.where(torch.isinf(bias), bias, bias.clamp(-big, big)).to(dtype)
