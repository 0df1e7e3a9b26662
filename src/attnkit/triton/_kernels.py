"""The pieces every fused-attention kernel shares: constants, the score function, the band
mask, masked tile loads, the key/query block ranges, and the autotune plumbing.

The kernels are in :mod:`attnkit.triton._forward` (forward) and
:mod:`attnkit.triton._backward` (preprocess, dK/dV, dQ); the decoding kernels sit with their
launcher in :mod:`attnkit.triton.decode`. The Python side of flash attention (argument
checks, launches, autograd) lives in :mod:`attnkit.triton.flash`.

Conventions inside the kernels:

- Scores, row maxima and the LSE are in natural units; only the difference from the row
  maximum goes to base 2: ``p = exp2((s - m) * log2(e))``. Folding ``log2(e)`` into the
  scale instead (``exp2(s2 - m2)``, one multiply fewer) rounds every score at its own
  magnitude after a non-dyadic scaling: 5e-4 at logits 1e4 in float32, which became a
  5e-4 relative error in every probability and a 1.6e-5 error in the LSE at logits ~60.
- The forward writes the LSE as two float32 rows, ``hi = fl(m + log l)`` (the LSE every
  caller sees) and ``lo``, the rounding error of that sum (an exact two-sum), so that
  ``hi + lo`` carries the float32 row max and sum without rounding them together. The
  backward recomputes ``P = exp2((s - hi) * log2(e) - lo * log2(e))``: exact to float32 at any
  magnitude (from ``hi`` alone, ``P`` would inherit ``hi``'s rounding, ``eps * |lse|``).
- ``s`` is the score that enters the softmax:
  ``s = softcap * tanh(scale * q.k / softcap)`` (or ``scale * q.k`` without softcap),
  then ``- slope * |i + Tk - Tq - j|`` with ALiBi.
- Query ``i``'s diagonal key is ``i + diag_off`` with ``diag_off = Tk - Tq`` (bottom-right
  alignment); key ``j`` is allowed iff ``diag - left <= j <= diag + right`` (causal folds
  into ``right = min(right, 0)``).
- Each loop over key (or query) blocks is split into up to three ranges: blocks the band
  cuts on the left, blocks fully inside the band (no mask arithmetic at all), and blocks
  the band or the sequence end cuts on the right.
- Segment ids (packed documents, padding) mask ``(i, j)`` unless both ids are equal and
  ``>= 0``. The host gives each position the span of the other axis holding its segment;
  a block's loop is cut to the union of its rows' spans, so for packed documents the
  blocks of other documents are never visited.
- Sinks (one logit per head) start each row's online softmax: ``m = sink``, ``l = 1``.
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
    """``(tanh(x), 1 - tanh(x)^2)``, each to a few float32 ulps for every x.

    ``1 - 2 / (e^{2x} + 1)`` cancels for small x (a relative error of ``eps / x``: 2e-3 in
    the output at softcap 1e4). Instead: ``tanh|x| = (1 - e) / (1 + e)`` with ``e =
    exp(-2|x|)`` in (0, 1] (never overflows; saturates to 1), and below ``|x| = 1/4``,
    where ``1 - e`` starts to cancel, the odd series to ``x^9`` (next term < 1e-8 relative).
    ``1 - tanh^2`` is ``4e / (1 + e)^2`` for the same reason near saturation. Plain
    arithmetic and ``exp2``: the same code compiles and runs in the interpreter.
    """
    a = tl.abs(x)
    e = tl.exp2(a * (-2.0 * LOG2E))
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    poly = 62.0 / 2835.0
    poly = poly * x2 - 17.0 / 315.0
    poly = poly * x2 + 2.0 / 15.0
    poly = poly * x2 - 1.0 / 3.0
    small = x + x * (x2 * poly)
    near0 = a < 0.25
    t = tl.where(near0, small, tl.where(x < 0, -big, big))
    sech2 = tl.where(near0, 1.0 - t * t, 4.0 * e / ((1.0 + e) * (1.0 + e)))
    return t, sech2


@triton.jit
def _scores(qk, qi, kj, diag_off, qk_scale, sc_in, sc_out, slope,
            HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw ``q.k`` -> natural-unit scores ``s``; also returns ``1 - tanh^2`` (softcap's
    derivative) for the backward.

    ``qi``/``kj`` are the query/key indices, shaped to broadcast against the tile
    (``(M, 1)``/``(1, N)``, or the transpose for the dK/dV kernel's transposed tiles).
    ``sc_in = scale / softcap``, ``sc_out = softcap``.
    """
    if HAS_SOFTCAP:
        t, dtanh = _tanh(qk * sc_in)
        s = t * sc_out
    else:
        dtanh = qk  # unused by callers; keeps one return signature
        s = qk * qk_scale
    if HAS_ALIBI:
        dist = (qi + diag_off - kj).to(tl.float32)
        s = s - slope * tl.abs(dist)
    return s, dtanh


@triton.jit
def _exp_from(s, m):
    """``exp(s - m)`` in base 2, the difference formed in natural units first."""
    return tl.exp2((s - m) * LOG2E)


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
def _mask_scores(s, qi, kj, Tk, diag_off, left, right, qid, kid, MASKED: tl.constexpr,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SEG: tl.constexpr):
    """``s`` with ``-inf`` where the band, the sequence end or the segments exclude
    ``(i, j)``. ``qid``/``kid`` are the segment ids of the rows/columns (broadcast like
    ``qi``/``kj``; unused without ``HAS_SEG``): equal ids attend, an id < 0 attends
    nothing. Blocks inside the band (``MASKED`` false) still need the segment test."""
    if MASKED:
        keep = _band(qi, kj, Tk, diag_off, left, right, HAS_LEFT, HAS_RIGHT)
        if HAS_SEG:
            keep = keep & (qid == kid) & (qid >= 0)
        s = tl.where(keep, s, float("-inf"))
    elif HAS_SEG:
        s = tl.where((qid == kid) & (qid >= 0), s, float("-inf"))
    return s


@triton.jit
def _load_ids(IDS, offs, n, HAS_SEG: tl.constexpr):
    """Segment ids at ``offs`` (-1, i.e. padding, past ``n``); ``offs`` itself without
    segments (a placeholder that the masks never read)."""
    if HAS_SEG:
        ids = tl.load(IDS + offs, mask=offs < n, other=-1)
    else:
        ids = offs
    return ids


@triton.jit
def _segment_span(LO, HI, offs, n, n_other, HAS_SEG: tl.constexpr):
    """The span ``[lo, hi)`` of the other axis that the rows (or columns) ``offs`` may
    attend at all, from the per-position spans the host computed
    (:func:`attnkit.triton._variants.segment_spans`); ``[0, n_other)`` without segments."""
    if HAS_SEG:
        lo = tl.min(tl.load(LO + offs, mask=offs < n, other=n_other), 0)
        hi = tl.max(tl.load(HI + offs, mask=offs < n, other=0), 0)
    else:
        lo = n_other * 0
        hi = n_other
    return lo, hi


@triton.jit
def _clip(start, stop, span_lo, span_hi, BLOCK: tl.constexpr):
    """A pass's block range ``[start, stop)`` cut to the segment span: blocks wholly
    outside it are never visited. ``start`` stays on the block grid."""
    start = tl.maximum(start, (span_lo // BLOCK) * BLOCK)
    stop = tl.minimum(stop, span_hi)
    return start, stop


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
        "HAS_SOFTCAP", "HAS_ALIBI", "HAS_SEG"]
