"""The pieces every fused-attention kernel shares: constants, the score function, the band
mask, masked tile loads, the key/query block ranges, and the autotune plumbing.

The kernels are in :mod:`attnkit.triton._forward` (forward) and
:mod:`attnkit.triton._backward` (preprocess, dK/dV, dQ); the decoding kernels sit with their
launcher in :mod:`attnkit.triton.decode`. The Python side of flash attention (argument
checks, launches, autograd) lives in :mod:`attnkit.triton.flash`.

Conventions inside the kernels:

- Scores are carried in base 2: ``s2 = s * log2(e)`` so that ``exp(s - m)`` becomes
  ``exp2(s2 - m2)`` (one fewer multiply per element). The LSE is stored in natural log
  (DESIGN.md) and converted back when the backward loads it.
- ``s`` is the score that enters the softmax:
  ``s = softcap * tanh(scale * q.k / softcap)`` (or ``scale * q.k`` without softcap),
  then ``- slope * |i + Tk - Tq - j|`` with ALiBi.
- Query ``i``'s diagonal key is ``i + diag_off`` with ``diag_off = Tk - Tq`` (bottom-right
  alignment); key ``j`` is allowed iff ``diag - left <= j <= diag + right`` (causal folds
  into ``right = min(right, 0)``).
- Each loop over key (or query) blocks is split into up to three ranges: blocks the band
  cuts on the left, blocks fully inside the band (no mask arithmetic at all), and blocks
  the band or the sequence end cuts on the right.
- Head dims are compile-time constants padded to a power of two (``BLOCK_DK``) with masked
  loads, so 80 or 96 work and the mask folds away when the dim is a power of two.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .. import spec

# Kernels may only read globals that are constexpr. exp(x) == exp2(x * LOG2E), and a base-2
# log-sum-exp times LN2 is the natural-log one (the values are attnkit.spec's).
LOG2E = tl.constexpr(spec.LOG2E)
LN2 = tl.constexpr(spec.LN2)


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on the CPU through NumPy)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^{2x} + 1): saturates cleanly to +-1 when e^{2x} over/underflows.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _scores(qk, qi, kj, diag_off, qk_scale2, sc_in, sc_out2, slope2,
            HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw ``q.k`` -> base-2 scores ``s2``; also returns ``tanh`` (softcap) for backward.

    ``qi``/``kj`` are the query/key indices, shaped to broadcast against the tile
    (``(M, 1)``/``(1, N)``, or the transpose for the dK/dV kernel's transposed tiles).
    ``qk_scale2 = scale * log2e``, ``sc_in = scale / softcap``, ``sc_out2 = softcap *
    log2e``, ``slope2 = slope * log2e``.
    """
    if HAS_SOFTCAP:
        t = _tanh(qk * sc_in)
        s2 = t * sc_out2
    else:
        t = qk  # unused by callers; keeps one return signature
        s2 = qk * qk_scale2
    if HAS_ALIBI:
        dist = (qi + diag_off - kj).to(tl.float32)
        s2 = s2 - slope2 * tl.abs(dist)
    return s2, t


@triton.jit
def _band(qi, kj, Tk, diag_off, left, right,
          HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Keep-mask (broadcast of ``qi`` and ``kj``): key inside [0, Tk) and inside the band."""
    keep = kj < Tk
    diag = qi + diag_off
    if HAS_LEFT:
        keep = keep & (kj >= diag - left)
    if HAS_RIGHT:
        keep = keep & (kj <= diag + right)
    return keep


@triton.jit
def _load_tile(ptrs, r, c, n_r, n_c, CHECK_R: tl.constexpr, CHECK_C: tl.constexpr):
    """Load a tile whose row/col indices ``r``/``c`` broadcast to its shape.

    Only the checks that can fail are emitted: an unmasked load of a full tile lets the
    compiler prove 16-byte alignment and pipeline it (cp.async) on Hopper.
    """
    if CHECK_R and CHECK_C:
        x = tl.load(ptrs, mask=(r < n_r) & (c < n_c), other=0.0)
    elif CHECK_R:
        x = tl.load(ptrs, mask=r < n_r, other=0.0)
    elif CHECK_C:
        x = tl.load(ptrs, mask=c < n_c, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _key_ranges(m0, Tk, diag_off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key-block ranges for the query rows ``[m0, m0 + BLOCK_M)``.

    Returns ``lo <= full_lo <= full_hi`` (multiples of BLOCK_N) and ``hi``: blocks in
    ``[lo, full_lo)`` and ``[full_hi, hi)`` need the mask, ``[full_lo, full_hi)`` do not.
    Integer division only ever sees non-negative operands (floor and truncation agree).
    """
    lo = m0 * 0
    hi = Tk + m0 * 0
    full_hi = (Tk // BLOCK_N) * BLOCK_N + m0 * 0
    if HAS_LEFT:
        lo = tl.maximum(m0 + diag_off - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(hi, m0 + BLOCK_M + diag_off + right)
        last = tl.maximum(m0 + diag_off + right + 1, 0)
        full_hi = tl.minimum(full_hi, (last // BLOCK_N) * BLOCK_N)
    lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = lo
    if HAS_LEFT:
        first = tl.maximum(m0 + BLOCK_M - 1 + diag_off - left, 0)
        full_lo = tl.maximum(lo, ((first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N)
    hi_ceil = ((tl.maximum(hi, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(full_lo, tl.maximum(hi_ceil, lo))
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _region(region: tl.constexpr, lo, full_lo, full_hi, hi):
    """Bounds of pass ``region`` (0: left-cut, 1: full, 2: right-cut blocks)."""
    if region == 0:
        start, stop = lo, full_lo
    elif region == 1:
        start, stop = full_lo, full_hi
    else:
        start, stop = full_hi, hi
    return start, stop


@triton.jit
def _query_ranges(n0, Tq, diag_off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query-block ranges for the key columns ``[n0, n0 + BLOCK_N)`` (mirror of above).

    Query ``i`` sees key ``j`` iff ``j - diag_off - right <= i <= j - diag_off + left``.
    """
    lo = n0 * 0
    hi = Tq + n0 * 0
    full_hi = (Tq // BLOCK_M) * BLOCK_M + n0 * 0
    if HAS_RIGHT:
        lo = tl.maximum(n0 - diag_off - right, 0)
    if HAS_LEFT:
        hi = tl.minimum(hi, n0 + BLOCK_N - diag_off + left)
        last = tl.maximum(n0 - diag_off + left + 1, 0)
        full_hi = tl.minimum(full_hi, (last // BLOCK_M) * BLOCK_M)
    lo = (lo // BLOCK_M) * BLOCK_M
    full_lo = lo
    if HAS_RIGHT:
        first = tl.maximum(n0 + BLOCK_N - 1 - diag_off - right, 0)
        full_lo = tl.maximum(lo, ((first + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
    hi_ceil = ((tl.maximum(hi, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    full_lo = tl.minimum(full_lo, tl.maximum(hi_ceil, lo))
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


# --------------------------------------------------------------------------------------
# Autotuning: each kernel's tile table (in its own module) becomes its configs
# --------------------------------------------------------------------------------------


def _configs(table, big: str, small: str) -> list[triton.Config]:
    if interpreting():
        # The interpreter runs one program at a time through NumPy: small tiles, one config.
        return [triton.Config({big: 16, small: 16, "DMIN": 0, "DMAX": 1 << 30}, num_warps=4,
                              num_stages=1)]
    return [triton.Config({big: b, small: sm, "DMIN": dmin, "DMAX": dmax}, num_warps=w,
                          num_stages=st) for b, sm, w, st, dmin, dmax in table]


def _prune(configs, named_args, **kwargs):
    """Keep the table entries offered for this (padded) head dim."""
    args = {**named_args, **kwargs}
    d = max(args["BLOCK_DK"], args["BLOCK_DV"])
    keep = [c for c in configs if c.kwargs.get("DMIN", 0) <= d <= c.kwargs.get("DMAX", 1 << 30)]
    return first_only(keep or configs[-1:])


def first_only(configs):
    """All configs, or only the first when ``ATTNKIT_TRITON_AUTOTUNE=0`` (skips the tuning
    runs and most compilations, e.g. for a quick correctness pass on a GPU)."""
    return configs[:1] if os.environ.get("ATTNKIT_TRITON_AUTOTUNE", "1") == "0" else configs


_KEY = ["Q_BUCKET", "K_BUCKET", "BLOCK_DK", "BLOCK_DV", "HAS_LEFT", "HAS_RIGHT",
        "HAS_SOFTCAP", "HAS_ALIBI"]
