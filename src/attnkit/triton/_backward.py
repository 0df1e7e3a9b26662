"""The backward kernels of fused attention: ``delta`` preprocessing, dK/dV per key block,
dQ per query block (no atomics, deterministic). Conventions and shared pieces:
:mod:`attnkit.triton._kernels`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._kernels import (
    _KEY,
    LOG2E,
    _clip,
    _configs,
    _key_ranges,
    _load_ids,
    _load_tile,
    _mask_scores,
    _prune,
    _query_ranges,
    _region,
    _scores,
    _segment_span,
    interpreting,
)

# The backward must recompute the forward's scores bit for bit: at logits ~1e4 one ulp of a
# score (1e-3 in float32) is that large a relative error in its probability. On the GPU
# k @ q^T (the dK/dV kernel's transposed tile) sums the same products in the same order as
# q @ k^T (tensor-core MMA and float32 FMA loops alike), so the kernel takes it, with no
# register transpose; the interpreter's BLAS does not (seen: 9e-5 apart at |s| ~ 450), so
# there the tile is formed as (q @ k^T)^T.
QK_AS_FORWARD = tl.constexpr(interpreting())

# Tile tables in the forward's format (see :mod:`attnkit.triton._forward`):
# (big block, small block, ...): dK/dV walks BLOCK_N keys x BLOCK_M queries, dQ BLOCK_M
# queries x BLOCK_N keys.
_DKDV_TABLE = [
    (128, 32, 8, 2, 16, 128),
    (128, 16, 8, 2, 16, 128),
    (64, 32, 8, 2, 16, 128),
    # With segment ids at D = 128 every tile above spills (the ids and their mask take
    # registers); these two do not (ptxas, sm_90, bf16), nor do they without segments.
    (128, 16, 8, 1, 16, 128),
    (64, 16, 8, 2, 16, 128),
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
def _load_lse(LSE, LSE_LO, row, offs, T):
    """The LSE as ``hi + lo`` (see :mod:`attnkit.triton._kernels`); a fully masked row
    (-inf) and padding rows load ``hi = +inf`` so that ``P = exp((s - hi) - lo)`` is 0 there
    instead of ``exp(-inf + inf) = NaN``."""
    hi = tl.load(LSE + row, mask=offs < T, other=float("inf"))
    hi = tl.where(hi == float("-inf"), float("inf"), hi)
    lo = tl.load(LSE_LO + row, mask=offs < T, other=0.0)
    return hi, lo * LOG2E  # lo in base 2: P = exp2((s - hi) * log2e - lo2), one FMA


@triton.jit
def _probs(s, hi, lo2):
    """``P = exp(s - (hi + lo))``: ``s - hi`` in natural units (no rounding at the LSE's
    magnitude), then one FMA into base 2."""
    return tl.exp2((s - hi) * LOG2E - lo2)


@triton.jit
def _dkdv_inner(dk, dv, k, kt, v, Q, DO, LSE, LSE_LO, DELTA, stride_qm, stride_qd, stride_dom,
                stride_dod, row0, offs_n, offs_dk, offs_dv, start, stop, Tq, Tk, diag_off, left,
                right, qk_scale, sc_in, sc_out, slope, q_ids, ids_k,
                Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
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
        hi, lo = _load_lse(LSE, LSE_LO, row0 + offs_m, offs_m, Tq)
        delta = tl.load(DELTA + row0 + offs_m, mask=row_ok, other=0.0)

        if QK_AS_FORWARD:
            kq = tl.trans(tl.dot(q, kt, input_precision=PRECISION))
        else:
            kq = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        st, dtanh_t = _scores(kq, offs_m[None, :], offs_n[:, None], diag_off, qk_scale, sc_in,
                              sc_out, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED or HAS_SEG:
            ids_q = _load_ids(q_ids, offs_m, Tq, HAS_SEG)
            st = _mask_scores(st, offs_m[None, :], offs_n[:, None], Tk, diag_off, left,
                              right, ids_q[None, :], ids_k[:, None], MASKED, HAS_LEFT,
                              HAS_RIGHT, HAS_SEG)
        pt = _probs(st, hi[None, :], lo[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        dst = pt * (dpt - delta[None, :])
        if HAS_SOFTCAP:
            dst = dst * dtanh_t
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.autotune(configs=_configs(_DKDV_TABLE, "BLOCK_N", "BLOCK_M"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, LSE_LO, DELTA, DK, DV, SLOPES, Q_IDS, KV_IDS, Q_LO, Q_HI,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, Hkv, G, Tq, Tk, diag_off, left, right, qk_scale, sc_in, sc_out, scale,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DMIN: tl.constexpr, DMAX: tl.constexpr,  # the tile table's head-dim range (pruning only)
):
    """One program per (key block, batch, KV head); loops over the G query heads that
    share the KV head, so GQA's dK/dV sum happens in registers (no atomics, deterministic).
    ``Q_LO``/``Q_HI`` (B, Tk): each key's query span under segments (``HAS_SEG``).
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
    if QK_AS_FORWARD:
        # K^T loaded as its own (Dk, BLOCK_N) tile, as the forward loads it: the
        # interpreter's BLAS then sums q @ k^T in the forward's order (a transposed view of
        # k takes another kernel, whose rounding at |q| ~ 20 put dK past the rule).
        kt = tl.load(K + off_b * stride_kb + off_hkv * stride_kh + offs_n[None, :] * stride_kn
                     + offs_dk[:, None] * stride_kd,
                     mask=col_ok[None, :] & (offs_dk[:, None] < Dk), other=0.0)
    else:
        kt = tl.trans(k)
    v = tl.load(V + off_b * stride_vb + off_hkv * stride_vh + offs_n[:, None] * stride_vn
                + offs_dv[None, :] * stride_vd,
                mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _query_ranges(n0, Tq, diag_off, left, right, BLOCK_M, BLOCK_N,
                                             HAS_LEFT, HAS_RIGHT)
    ids_k = _load_ids(KV_IDS + off_b * Tk, offs_n, Tk, HAS_SEG)
    q_ids = Q_IDS + off_b * Tq
    span_lo, span_hi = _segment_span(Q_LO + off_b * Tk, Q_HI + off_b * Tk, offs_n, Tk, Tq,
                                     HAS_SEG)
    for g in range(0, G):
        off_h = off_hkv * G + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        row0 = (off_b * H + off_h) * Tq
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(SLOPES + off_b * H + off_h)
        for region in tl.static_range(3):
            start, stop = _region(region, lo, full_lo, full_hi, hi)
            if HAS_SEG:
                start, stop = _clip(start, stop, span_lo, span_hi, BLOCK_M)
            dk, dv = _dkdv_inner(
                dk, dv, k, kt, v, q_base, do_base, LSE, LSE_LO, DELTA, stride_qm, stride_qd,
                stride_dom, stride_dod, row0, offs_n, offs_dk, offs_dv, start, stop, Tq, Tk,
                diag_off, left, right, qk_scale, sc_in, sc_out, slope, q_ids, ids_k, Dk, Dv,
                BLOCK_DK, BLOCK_DV, BLOCK_M, region != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                HAS_ALIBI, HAS_SEG, PRECISION)

    dk = dk * scale  # d(scale * q.k)/dk: the scale was left out of the loop
    tl.store(DK + off_b * stride_dkb + off_hkv * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_dk[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dk[None, :] < Dk))
    tl.store(DV + off_b * stride_dvb + off_hkv * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_dv[None, :] * stride_dvd, dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < Dv))


@triton.jit
def _dq_inner(dq, q, do, lse_hi, lse_lo, delta, k_ptrs, v_ptrs, stride_kn, stride_kd,
              stride_vn, stride_vd, offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left,
              right, qk_scale, sc_in, sc_out, slope, ids_q, kv_ids,
              Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr,
              BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptrs + offs_n[:, None] * stride_kn + offs_dk[None, :] * stride_kd,
                       offs_n[:, None], offs_dk[None, :], Tk, Dk, MASKED, Dk != BLOCK_DK)
        v = _load_tile(v_ptrs + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                       offs_n[:, None], offs_dv[None, :], Tk, Dv, MASKED, Dv != BLOCK_DV)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s, dtanh = _scores(qk, offs_m[:, None], offs_n[None, :], diag_off, qk_scale, sc_in,
                           sc_out, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED or HAS_SEG:
            ids_k = _load_ids(kv_ids, offs_n, Tk, HAS_SEG)
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], Tk, diag_off, left, right,
                             ids_q[:, None], ids_k[None, :], MASKED, HAS_LEFT, HAS_RIGHT,
                             HAS_SEG)
        p = _probs(s, lse_hi[:, None], lse_lo[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * dtanh
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.autotune(configs=_configs(_DQ_TABLE, "BLOCK_M", "BLOCK_N"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, LSE_LO, DELTA, DQ, SLOPES, Q_IDS, KV_IDS, KV_LO, KV_HI,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, G, Tq, Tk, diag_off, left, right, qk_scale, sc_in, sc_out, scale,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr,
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
    lse_hi, lse_lo = _load_lse(LSE, LSE_LO, row0 + offs_m, offs_m, Tq)
    delta = tl.load(DELTA + row0 + offs_m, mask=row_ok, other=0.0)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + off_b * H + off_h)

    k_ptrs = K + off_b * stride_kb + off_hkv * stride_kh
    v_ptrs = V + off_b * stride_vb + off_hkv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_DK], dtype=tl.float32)
    ids_q = _load_ids(Q_IDS + off_b * Tq, offs_m, Tq, HAS_SEG)
    kv_ids = KV_IDS + off_b * Tk
    span_lo, span_hi = _segment_span(KV_LO + off_b * Tq, KV_HI + off_b * Tq, offs_m, Tq, Tk,
                                     HAS_SEG)
    lo, full_lo, full_hi, hi = _key_ranges(m0, Tk, diag_off, left, right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    for region in tl.static_range(3):
        start, stop = _region(region, lo, full_lo, full_hi, hi)
        if HAS_SEG:
            start, stop = _clip(start, stop, span_lo, span_hi, BLOCK_N)
        dq = _dq_inner(
            dq, q, do, lse_hi, lse_lo, delta, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn,
            stride_vd, offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
            qk_scale, sc_in, sc_out, slope, ids_q, kv_ids, Dk, Dv, BLOCK_DK, BLOCK_DV, BLOCK_N,
            region != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_SEG, PRECISION)
    dq = dq * scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm
             + offs_dk[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dk[None, :] < Dk))
