"""Triton kernels of the fused attention: forward, backward (preprocess, dK/dV, dQ).

Read top to bottom: the score function and the band mask shared by every kernel, the
key-block ranges, the forward inner loop and kernel, then the three backward kernels.
The Python side (argument checks, launches, autograd) lives in :mod:`attnkit.triton.flash`.

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

LOG2E = 1.4426950408889634  # 1 / ln(2): exp(x) == exp2(x * LOG2E)


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on the CPU through NumPy)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^{2x} + 1): saturates cleanly to +-1 when e^{2x} over/underflows.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


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
# Forward
# --------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
               offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
               qk_scale2, sc_in, sc_out2, slope2,
               Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
               HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               PRECISION: tl.constexpr):
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_ptrs + offs_n[None, :] * stride_kn + offs_dk[:, None] * stride_kd
        kt = _load_tile(kt_ptrs, offs_dk[:, None], offs_n[None, :], Dk, Tk,
                        Dk != BLOCK_DK, MASKED)
        qk = tl.dot(q, kt, input_precision=PRECISION)
        s2, _ = _scores(qk, offs_m[:, None], offs_n[None, :], diag_off, qk_scale2, sc_in,
                        sc_out2, slope2, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            keep = _band(offs_m[:, None], offs_n[None, :], Tk, diag_off, left, right, HAS_LEFT,
                         HAS_RIGHT)
            s2 = tl.where(keep, s2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s2, 1))
            # A row with nothing allowed so far keeps m = -inf; subtract 0 instead so
            # exp2(-inf - -inf) never makes a NaN (its p and alpha come out 0 and 1).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s2, 1))
            m_use = m_new
        p = tl.exp2(s2 - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt_ptrs = v_ptrs + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
        v = _load_tile(vt_ptrs, offs_n[:, None], offs_dv[None, :], Tk, Dv, MASKED,
                       Dv != BLOCK_DV)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# Hopper tile table: (BLOCK_M, BLOCK_N, num_warps, num_stages, smallest and largest padded
# head dim it is offered for). Chosen from ptxas resource reports for sm_90 (no local-memory
# spills at D = 64 / 128 for the entries offered there); the autotuner picks among the few
# that apply to a given head dim.
_FWD_TABLE = [
    (128, 64, 4, 3, 16, 64),
    (128, 128, 8, 3, 16, 128),
    (128, 128, 8, 2, 16, 128),
    (128, 64, 8, 3, 16, 128),
    (64, 64, 4, 3, 16, 128),
    (128, 32, 8, 2, 256, 256),
    (64, 64, 4, 2, 256, 256),
    (64, 32, 4, 2, 256, 256),
]
# (big block, small block, ...): dK/dV walks BLOCK_N keys x BLOCK_M queries, dQ BLOCK_M
# queries x BLOCK_N keys.
_DKDV_TABLE = [
    (128, 32, 8, 2, 16, 128),
    (128, 16, 8, 2, 16, 128),
    (64, 32, 8, 2, 16, 128),
    (64, 32, 4, 3, 16, 64),
    (64, 16, 8, 1, 256, 256),
    (32, 32, 4, 1, 256, 256),
]
_DQ_TABLE = [
    (128, 64, 8, 2, 16, 128),
    (128, 64, 8, 3, 16, 128),
    (128, 32, 8, 2, 16, 128),
    (64, 64, 4, 3, 16, 128),
    (64, 32, 4, 1, 256, 256),
    (32, 32, 4, 1, 256, 256),
]


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


@triton.autotune(configs=_configs(_FWD_TABLE, "BLOCK_M", "BLOCK_N"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, SLOPES,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, G, Tq, Tk, diag_off, left, right, qk_scale2, sc_in, sc_out2,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DMIN: tl.constexpr, DMAX: tl.constexpr,  # the tile table's head-dim range (pruning only)
):
    # Last query blocks first: under a causal band they have the most keys, and starting
    # the long programs early shortens the tail of the launch.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    off_hkv = off_h // G  # GQA: query head h reads KV head h // G, never a copy
    m0 = start_m * BLOCK_M

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)

    q_ptrs = (Q + off_b * stride_qb + off_h * stride_qh
              + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < Tq) & (offs_dk[None, :] < Dk), other=0.0)
    # K is read transposed, (BLOCK_DK, BLOCK_N), so that q @ kt needs no shuffle.
    k_ptrs = K + off_b * stride_kb + off_hkv * stride_kh
    v_ptrs = V + off_b * stride_vb + off_hkv * stride_vh

    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(SLOPES + off_b * H + off_h) * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _key_ranges(m0, Tk, diag_off, left, right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    # Three passes: band-cut blocks, full blocks (no mask arithmetic), band/end-cut blocks.
    for region in tl.static_range(3):
        start, stop = _region(region, lo, full_lo, full_hi, hi)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
            qk_scale2, sc_in, sc_out2, slope2, Dk, Dv, BLOCK_DK, BLOCK_DV, BLOCK_N, region != 1,
            HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, PRECISION)

    # A row with no allowed key has l = 0: output 0 and LSE -inf, never 0/0.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + off_bh.to(tl.int64) * Tq + offs_m, lse, mask=offs_m < Tq)
    o_ptrs = (O + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < Dv))


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------


@triton.jit
def _bwd_preprocess(O, DO, DLSE, DELTA,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    H, Tq, Dv: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    """``delta = rowsum(dO * O) - dLSE`` (float32, (B, H, Tq)).

    ``dS = P * (dP - delta)``; the LSE's own gradient ``dLSE * P`` folds into delta.
    """
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    mask = (offs_m[:, None] < Tq) & (offs_d[None, :] < Dv)
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :] * stride_od, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    row = off_bh.to(tl.int64) * Tq + offs_m
    if HAS_DLSE:
        delta = delta - tl.load(DLSE + row, mask=offs_m < Tq, other=0.0)
    tl.store(DELTA + row, delta, mask=offs_m < Tq)


@triton.jit
def _load_lse2(LSE, row, offs, T):
    # Base-2 LSE; a fully masked row (-inf) and padding rows load +inf so that
    # P = exp2(s2 - lse2) is 0 there instead of exp2(-inf + inf) = NaN.
    lse = tl.load(LSE + row, mask=offs < T, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse * 1.4426950408889634


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                row0, offs_n, offs_dk, offs_dv, start, stop, Tq, Tk, diag_off, left, right,
                qk_scale2, sc_in, sc_out2, slope2,
                Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate one query head's contribution to a key block's dK, dV.

    Works on transposed tiles (BLOCK_N, BLOCK_M) so that dK, dV come out row-major.
    """
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Tq
        q = _load_tile(Q + offs_m[:, None] * stride_qm + offs_dk[None, :] * stride_qd,
                       offs_m[:, None], offs_dk[None, :], Tq, Dk, MASKED, Dk != BLOCK_DK)
        do = _load_tile(DO + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                        offs_m[:, None], offs_dv[None, :], Tq, Dv, MASKED, Dv != BLOCK_DV)
        lse2 = _load_lse2(LSE, row0 + offs_m, offs_m, Tq)
        delta = tl.load(DELTA + row0 + offs_m, mask=row_ok, other=0.0)

        kq = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        s2t, tt = _scores(kq, offs_m[None, :], offs_n[:, None], diag_off, qk_scale2, sc_in,
                          sc_out2, slope2, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            keep = _band(offs_m[None, :], offs_n[:, None], Tk, diag_off, left, right, HAS_LEFT,
                         HAS_RIGHT)
            s2t = tl.where(keep, s2t, float("-inf"))
        pt = tl.exp2(s2t - lse2[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        dst = pt * (dpt - delta[None, :])
        if HAS_SOFTCAP:
            dst = dst * (1.0 - tt * tt)
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.autotune(configs=_configs(_DKDV_TABLE, "BLOCK_N", "BLOCK_M"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, SLOPES,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, Hkv, G, Tq, Tk, diag_off, left, right, qk_scale2, sc_in, sc_out2, scale,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DMIN: tl.constexpr, DMAX: tl.constexpr,  # the tile table's head-dim range (pruning only)
):
    """One program per (key block, batch, KV head); loops over the G query heads that
    share the KV head, so GQA's dK/dV sum happens in registers (no atomics, deterministic).
    """
    n0 = tl.program_id(0) * BLOCK_N
    off_bh = tl.program_id(1)
    off_b = (off_bh // Hkv).to(tl.int64)
    off_hkv = (off_bh % Hkv).to(tl.int64)

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < Tk
    k = tl.load(K + off_b * stride_kb + off_hkv * stride_kh + offs_n[:, None] * stride_kn
                + offs_dk[None, :] * stride_kd,
                mask=col_ok[:, None] & (offs_dk[None, :] < Dk), other=0.0)
    v = tl.load(V + off_b * stride_vb + off_hkv * stride_vh + offs_n[:, None] * stride_vn
                + offs_dv[None, :] * stride_vd,
                mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _query_ranges(n0, Tq, diag_off, left, right, BLOCK_M, BLOCK_N,
                                             HAS_LEFT, HAS_RIGHT)
    for g in range(0, G):
        off_h = off_hkv * G + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        row0 = (off_b * H + off_h) * Tq
        slope2 = 0.0
        if HAS_ALIBI:
            slope2 = tl.load(SLOPES + off_b * H + off_h) * 1.4426950408889634
        for region in tl.static_range(3):
            start, stop = _region(region, lo, full_lo, full_hi, hi)
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_base, do_base, LSE, DELTA, stride_qm, stride_qd, stride_dom,
                stride_dod, row0, offs_n, offs_dk, offs_dv, start, stop, Tq, Tk, diag_off,
                left, right, qk_scale2, sc_in, sc_out2, slope2, Dk, Dv, BLOCK_DK, BLOCK_DV,
                BLOCK_M, region != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, PRECISION)

    dk = dk * scale  # d(scale * q.k)/dk: the scale was left out of the loop
    tl.store(DK + off_b * stride_dkb + off_hkv * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_dk[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dk[None, :] < Dk))
    tl.store(DV + off_b * stride_dvb + off_hkv * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_dv[None, :] * stride_dvd, dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < Dv))


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
              offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
              qk_scale2, sc_in, sc_out2, slope2,
              Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr,
              BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptrs + offs_n[:, None] * stride_kn + offs_dk[None, :] * stride_kd,
                       offs_n[:, None], offs_dk[None, :], Tk, Dk, MASKED, Dk != BLOCK_DK)
        v = _load_tile(v_ptrs + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                       offs_n[:, None], offs_dv[None, :], Tk, Dv, MASKED, Dv != BLOCK_DV)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s2, t = _scores(qk, offs_m[:, None], offs_n[None, :], diag_off, qk_scale2, sc_in,
                        sc_out2, slope2, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            keep = _band(offs_m[:, None], offs_n[None, :], Tk, diag_off, left, right, HAS_LEFT,
                         HAS_RIGHT)
            s2 = tl.where(keep, s2, float("-inf"))
        p = tl.exp2(s2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.autotune(configs=_configs(_DQ_TABLE, "BLOCK_M", "BLOCK_N"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, SLOPES,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, G, Tq, Tk, diag_off, left, right, qk_scale2, sc_in, sc_out2, scale,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DMIN: tl.constexpr, DMAX: tl.constexpr,  # the tile table's head-dim range (pruning only)
):
    """One program per (query block, batch, head): dQ = sum_j dS_ij k_j, no atomics."""
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (causal) blocks first
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    off_hkv = off_h // G
    m0 = start_m * BLOCK_M

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Tq
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm
                + offs_dk[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_dk[None, :] < Dk), other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_dv[None, :] * stride_dod,
                 mask=row_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)
    row0 = off_bh.to(tl.int64) * Tq
    lse2 = _load_lse2(LSE, row0 + offs_m, offs_m, Tq)
    delta = tl.load(DELTA + row0 + offs_m, mask=row_ok, other=0.0)
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(SLOPES + off_b * H + off_h) * 1.4426950408889634

    k_ptrs = K + off_b * stride_kb + off_hkv * stride_kh
    v_ptrs = V + off_b * stride_vb + off_hkv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_DK], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _key_ranges(m0, Tk, diag_off, left, right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    for region in tl.static_range(3):
        start, stop = _region(region, lo, full_lo, full_hi, hi)
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right, qk_scale2,
            sc_in, sc_out2, slope2, Dk, Dv, BLOCK_DK, BLOCK_DV, BLOCK_N, region != 1, HAS_LEFT,
            HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, PRECISION)
    dq = dq * scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm
             + offs_dk[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dk[None, :] < Dk))
