"""NaN in a masked position must not leak: the one place that keeps it out.

A masked weight is exactly 0, but ``0 * nan = nan``: a NaN or inf in a key/value row that
no query may attend (padding, say) would still reach the output through the ``w @ v``
matmul, and every gradient through the backward's matmuls. NaN in an *attended* position
must propagate. The helpers here separate the two; each is paid only when some entry is
non-finite, which one reduction finds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..spec import is_half
from ._scores import group, ungroup

__all__ = [
    "all_finite",
    "attends",
    "finite_safe_linear",
    "guard_masked_nonfinite",
    "without_masked_nonfinite",
    "zero_masked_keys",
    "zero_unattended_nonfinite",
]

Outputs = tuple[torch.Tensor, "torch.Tensor | None"]


def all_finite(*xs: torch.Tensor) -> bool:
    """True when every entry of every tensor is finite. One reduction each and one host
    sync in all: a finite sum implies finite entries (inf or NaN anywhere makes the sum inf
    or NaN); a sum that overflows merely sends the caller down its slower, still exact,
    path."""
    total = sum(torch.sum(x, dtype=torch.float32 if is_half(x.dtype) else None) for x in xs)
    return bool(torch.isfinite(torch.as_tensor(total)))


def zero_unattended_nonfinite(
    k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, shape: tuple[int, ...], G: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with NaN/inf zeroed in the key rows no query may attend (new
    tensors; the caller's are untouched). Only called when some entry is non-finite."""
    used = keep.expand(shape).any(dim=-2)  # (..., H, Tk)
    if G > 1:
        used = used.unflatten(-2, (used.shape[-2] // G, G)).any(dim=-2)  # (..., Hkv, Tk)
    while used.ndim > k.ndim - 1:  # leading dims q broadcast over k's
        used = used.any(dim=0)
    for i, n in enumerate(k.shape[:-2]):
        if n == 1 and used.shape[i] != 1:
            used = used.any(dim=i, keepdim=True)
    used = used[..., None]  # (..., Hkv, Tk, 1)
    return (
        torch.where(used | torch.isfinite(k), k, 0.0),
        torch.where(used | torch.isfinite(v), v, 0.0),
    )


def zero_masked_keys(x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Keys or values ``x (B, Hkv, Tk, D)`` with the positions a key mask ``(B, Tk)`` (True =
    may attend) excludes zeroed, whatever they hold; a new tensor. Branch-free: for callers
    whose mask is per key, so that no query attends a masked row."""
    if key_mask is None:
        return x
    return torch.where(key_mask[:, None, :, None], x, torch.zeros_like(x))


def attends(
    keep: torch.Tensor, bad: torch.Tensor, G: int, out_shape: tuple[int, ...]
) -> torch.Tensor:
    """Bool ``out_shape = (..., H, Tq, X)``: True where a query may attend a key whose
    entry ``bad (..., Hkv, Tk, X)`` is set (``X`` is ``Dv``, or 1 for whole key rows)."""
    allowed = keep.to(torch.float32)  # counts of 0/1 products: exact
    allowed = allowed.expand(tuple(out_shape[:-1]) + (bad.shape[-2],))  # (..., H, Tq, Tk)
    hits = group(allowed, G) @ bad.to(allowed.dtype)  # (..., Hkv, G*Tq, X)
    return ungroup(hits, G, out_shape[-2]) > 0


def without_masked_nonfinite(
    out: torch.Tensor, clean: torch.Tensor, v: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Keep NaN/inf from *masked* value rows out of the output.

    Rows of ``out`` that attend a non-finite value keep it (NaN in an attended position
    propagates); the others take ``clean``, the output recomputed with non-finite values
    zeroed. Only called when ``v`` has non-finite entries.
    """
    return torch.where(attends(keep, ~torch.isfinite(v), 1, out.shape), out, clean)


def guard_masked_nonfinite(
    run: Callable[[torch.Tensor, torch.Tensor], Outputs],
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    shape: tuple[int, ...],
    G: int,
) -> Outputs:
    """``run(k, v) -> (out, weights)``, a dot-product attention under every constraint
    ``keep`` (scores ``shape``, group size ``G``), with masked NaN/inf kept out.

    Garbage in key/value rows no query may attend is zeroed up front, so that no
    ``0 * nan`` reaches the output or, in the backward, any gradient. A non-finite entry
    that some queries attend and others may not costs a second run: those that attend it
    keep its NaN/inf; the others take the result computed with it zeroed.
    """
    if keep is None or all_finite(k, v):
        return run(k, v)
    k, v = zero_unattended_nonfinite(k, v, keep, shape, G)
    if all_finite(k, v):
        return run(k, v)
    out, weights = run(k, v)
    clean_out, clean_w = run(
        torch.nan_to_num(k, 0.0, 0.0, 0.0), torch.nan_to_num(v, 0.0, 0.0, 0.0)
    )
    bad_k = (~torch.isfinite(k)).any(dim=-1, keepdim=True)  # (..., Hkv, Tk, 1)
    bad = bad_k | ~torch.isfinite(v)  # a non-finite key spoils its whole score
    out = torch.where(attends(keep, bad, G, out.shape), out, clean_out)
    if weights is not None and clean_w is not None:
        rows = attends(keep, bad_k, G, out.shape[:-1] + (1,))  # (..., H, Tq, 1)
        weights = torch.where(rows, weights, clean_w)
    return out, weights


class _FiniteSafeLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose weight gradient reads NaN/inf in ``x`` as 0.

    ``dW = dy^T x``: a padded key/value row that no query may attend has ``dy = 0``, but
    ``0 * nan = nan`` would still spoil the whole weight gradient (as the NumPy reference
    does not). Where the row is attended, ``dy`` carries the NaN itself, so NaN still
    propagates. Used only when ``x`` has a non-finite entry.
    """

    @staticmethod
    def forward(
        ctx: object, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # type: ignore[attr-defined]
        ctx.has_bias = bias is not None  # type: ignore[attr-defined]
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(
        ctx: object, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        g2 = g.reshape(-1, g.shape[-1])  # (N, out)
        x2 = torch.where(torch.isfinite(x), x, 0.0).reshape(-1, x.shape[-1])  # (N, in)
        d_bias = g2.sum(dim=0) if ctx.has_bias else None  # type: ignore[attr-defined]
        return g @ weight, g2.T @ x2, d_bias


def finite_safe_linear(lin: nn.Linear, x: torch.Tensor, masked: bool) -> torch.Tensor:
    """``lin(x)``; through :class:`_FiniteSafeLinear` when ``x`` holds NaN/inf and a mask
    may leave some of its rows unattended (only then is the finiteness check, a host sync
    on GPU, paid)."""
    if not masked or all_finite(x):
        return lin(x)
    return _FiniteSafeLinear.apply(x, lin.weight, lin.bias)
