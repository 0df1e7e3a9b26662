"""The IEEE sum of the non-finite entries each query may attend, without reading a tensor
back: what :mod:`attnkit.torch._nonfinite` (and ring attention's block op) add back to an
output computed from inputs whose NaN/inf were zeroed.

The entries removed from an input (0 where it was finite, else NaN or +-inf) are summed
over each query's allowed keys: NaN if any NaN or both infinities, +-inf if one sign only,
else 0. Prefix sums over the keys carry that exactly under a band open to the left; a
band with a left edge, or any other pattern, counts each kind in float64 instead
(:func:`kind_codes`, :func:`from_counts`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._keep import Keep

__all__ = ["ValueFix", "bad_part", "band_sum", "dense_sum", "from_counts", "interval_sum",
           "kind_codes"]


def bad_part(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x with non-finite entries zeroed, x - that)``: the second is 0 where ``x`` is
    finite and NaN/+-inf where it is not. It only carries those values into the forward
    (detached: a gradient through ``x - clean`` would cancel against the kernel's in
    rounding, and the non-finite entries have none to give)."""
    clean = torch.nan_to_num(x, 0.0, 0.0, 0.0)
    return clean, (x.detach() - clean.detach())


def _last_key(keep: Keep) -> torch.Tensor:
    """Index of the last key each query may attend (``(..., Tq, 1)``; -1 when none),
    under the band and the per-query lengths."""
    Tq, Tk = keep.shape[-2], keep.shape[-1]
    right = keep.band[1] if keep.band is not None else None
    i = torch.arange(Tq, device=keep.device)[:, None]
    # No right edge: past the last key for every row (Tk alone falls short once Tq > Tk).
    hi = (i + (Tk - Tq) + (Tq + Tk if right is None else right)).clamp(max=Tk - 1)
    if keep.limits is not None:
        hi = torch.minimum(hi, keep.limits - 1)
    return hi.clamp(min=-1)


def _first_key(keep: Keep) -> torch.Tensor:
    """Index of the first key of each query's band (``(Tq, 1)``, >= 0)."""
    Tq, Tk = keep.shape[-2], keep.shape[-1]
    left = keep.band[0] if keep.band is not None else None
    i = torch.arange(Tq, device=keep.device)[:, None]
    return (i + (Tk - Tq) - (Tk if left is None else left)).clamp(min=0)


def _gather_rows(prefix: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``prefix (..., Hkv, Tk + 1, X)`` at key rows ``index (..., Tq, 1)`` (per query,
    possibly per batch row) -> ``(..., Hkv, Tq, X)``."""
    if index.ndim == 2:  # the same rows for every batch row and head
        return prefix.index_select(-2, index[:, 0])
    lead = torch.broadcast_shapes(prefix.shape[:-2], index.shape[:-2])
    idx = index.expand(lead + (index.shape[-2], prefix.shape[-1]))
    return torch.gather(prefix.expand(lead + prefix.shape[-2:]), -2, idx)


def _with_zero_row(x: torch.Tensor) -> torch.Tensor:
    """``x (..., Tk, X)`` with a row of zeros in front (so that index -1 + 1 reads 0)."""
    return F.pad(x, (0, 0, 1, 0))


def kind_codes(bad: torch.Tensor, Tk: int) -> torch.Tensor:
    """``bad`` (0 or NaN/+-inf) as float64 codes whose sums count each kind exactly:
    NaN = 1, +inf = S, -inf = S^2 with S = Tk + 1 (so S^3 stays below 2^53 for Tk up to
    2e5)."""
    S = float(Tk + 1)
    return torch.nan_to_num(bad.detach().to(torch.float64), 1.0, S, S * S)


def from_counts(n: torch.Tensor, Tk: int, dtype: torch.dtype) -> torch.Tensor:
    """Sums of :func:`kind_codes` back to the IEEE sum of what they counted: NaN if any
    NaN or both infinities, +-inf if only one, else 0."""
    S = float(Tk + 1)
    nan, pos, neg = n % S, (n // S) % S, n // (S * S)
    inf = torch.tensor(float("inf"), dtype=dtype, device=n.device)
    zero = torch.zeros((), dtype=dtype, device=n.device)
    signed = torch.where(pos > 0, inf, zero) - torch.where(neg > 0, inf, zero)  # nan if both
    return torch.where(nan > 0, inf - inf, signed)


def interval_sum(bad: torch.Tensor, keep: Keep) -> torch.Tensor:
    """IEEE sum of ``bad (..., Hkv, Tk, X)`` over each query's band of keys ->
    ``(..., Hkv, Tq, X)``."""
    left, right = keep.band if keep.band is not None else (None, None)
    if left is None:  # prefix sums carry NaN and +-inf exactly: 0 + inf = inf, inf - inf...
        prefix = bad.cumsum_(-2)  # bad is the caller's scratch
        Tq, Tk = keep.shape[-2], keep.shape[-1]
        first = Tk - Tq + (right if right is not None else Tk)  # last key of query 0
        if keep.limits is None and right is not None and 0 <= first and first + Tq <= Tk:
            return prefix[..., first:first + Tq, :]  # query i: prefix up to first + i
        return _gather_rows(_with_zero_row(prefix), _last_key(keep) + 1)
    hi = _last_key(keep)
    Tk = keep.shape[-1]
    counts = _with_zero_row(kind_codes(bad, Tk).cumsum(-2))
    lo = torch.minimum(_first_key(keep), hi + 1)  # empty band: lo = hi + 1, count 0
    n = _gather_rows(counts, hi + 1) - _gather_rows(counts, lo)
    return from_counts(n, Tk, bad.dtype)


def dense_sum(bad_rows: torch.Tensor, keep: Keep, G: int) -> torch.Tensor:
    """IEEE sum of ``bad_rows (..., Hkv, Tk)`` (0 or NaN/+-inf per key) over each query's
    allowed keys -> ``(..., H, Tq, 1)``, or ``(..., Hkv, G, Tq, 1)`` with GQA. A select and a
    sum over the mask's own shape: NaN and +-inf add up exactly as they should."""
    allowed = keep.full()  # (..., H|1, Tq|1, Tk)
    if G > 1:
        lead, (Hm, Tqm, Tk) = allowed.shape[:-3], allowed.shape[-3:]
        allowed = allowed.reshape(lead + ((Hm // G, G) if Hm > 1 else (1, 1)) + (Tqm, Tk))
        bad_rows = bad_rows[..., None, None, :]  # (..., Hkv, 1, 1, Tk)
    else:
        bad_rows = bad_rows[..., None, :]  # (..., H, 1, Tk)
    return torch.where(allowed, bad_rows.detach(), 0.0).sum(dim=-1, keepdim=True)


def band_sum(bad: torch.Tensor, keep: Keep, G: int) -> torch.Tensor:
    """:func:`interval_sum` of ``bad`` (the caller's scratch), with the axis of a GQA
    group's heads when ``G > 1`` (one band for every head of a group)."""
    fix = interval_sum(bad, keep)
    return fix.unsqueeze(-3) if G > 1 else fix


class ValueFix:
    """Ring attention's block op (:func:`attnkit.torch.lse.attention_with_lse`): values
    ``v (B, Hkv, Tk, Dv)`` as ``clean`` (non-finite entries zeroed) and, per query row,
    the IEEE sum of the removed entries over the keys the row may attend (0, NaN or +-inf
    per feature): ``softmax(s) @ v`` is ``softmax(s) @ clean`` plus that, for weights > 0,
    whatever the entries held, and masked keys add nothing.

    Without causal or segments every row attends every (unmasked, unzeroed) key: one sum.
    Under causal alone, prefix sums over the keys. With segments, the allowed pairs of a
    tile times the entries' kinds counted exactly (:func:`kind_codes`)."""

    def __init__(self, v: torch.Tensor, offset: int | None, segments: bool) -> None:
        self.clean = torch.nan_to_num(v, 0.0, 0.0, 0.0)
        bad = (v - self.clean).unsqueeze(2)  # (B, Hkv, 1, Tk, Dv)
        self.offset, self.Tk, self.segments = offset, v.shape[-2], segments
        if segments:  # (B, Hkv, 1, Tk, Dv) counts of each kind, exact in float64
            self.sums = kind_codes(bad, self.Tk)
        elif offset is None:  # (B, Hkv, 1, 1, Dv)
            self.sums = bad.sum(-2, keepdim=True)
        else:  # (B, Hkv, 1, Tk + 1, Dv), a zero row in front: row i reads keys j <= i + offset
            self.sums = _with_zero_row(bad.cumsum(-2))

    def rows(self, r0: int, r1: int, j: int, keep: torch.Tensor | None) -> torch.Tensor:
        """``(B, Hkv, 1, r1 - r0 | 1, Dv)`` for query rows ``[r0, r1)``, which see keys
        ``[0, j)`` under the allowed pairs ``keep`` of their tile."""
        if self.segments:
            assert keep is not None  # segments always mask some pair
            n = keep.to(self.sums.dtype) @ self.sums[..., :j, :]  # keep: (B, 1, 1, Tt, j)
            return from_counts(n, self.Tk, self.clean.dtype)
        if self.offset is None:
            return self.sums
        last = torch.arange(r0, r1, device=self.sums.device) + (self.offset + 1)
        return self.sums.index_select(-2, last.clamp_(0, self.Tk))
