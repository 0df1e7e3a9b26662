"""The forward kernel of fused attention: online softmax over key blocks, one program per
(query block, batch, head). Conventions and shared pieces: :mod:`attnkit.triton._kernels`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._kernels import (
    _KEY,
    _clip,
    _configs,
    _exp_from,
    _key_ranges,
    _load_ids,
    _load_tile,
    _mask_scores,
    _prune,
    _region,
    _scores,
    _segment_span,
)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
               offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
               qk_scale, sc_in, sc_out, slope, ids_q, kv_ids,
               Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
               HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_ptrs + offs_n[None, :] * stride_kn + offs_dk[:, None] * stride_kd
        kt = _load_tile(kt_ptrs, offs_dk[:, None], offs_n[None, :], Dk, Tk,
                        Dk != BLOCK_DK, MASKED)
        qk = tl.dot(q, kt, input_precision=PRECISION)
        s, _ = _scores(qk, offs_m[:, None], offs_n[None, :], diag_off, qk_scale, sc_in,
                       sc_out, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED or HAS_SEG:
            ids_k = _load_ids(kv_ids, offs_n, Tk, HAS_SEG)
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], Tk, diag_off, left, right,
                             ids_q[:, None], ids_k[None, :], MASKED, HAS_LEFT, HAS_RIGHT,
                             HAS_SEG)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with nothing allowed so far keeps m = -inf; subtract 0 instead so
            # exp2(-inf - -inf) never makes a NaN (its p and alpha come out 0 and 1).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = _exp_from(s, m_use[:, None])
        alpha = _exp_from(m_i, m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt_ptrs = v_ptrs + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
        v = _load_tile(vt_ptrs, offs_n[:, None], offs_dv[None, :], Tk, Dv, MASKED,
                       Dv != BLOCK_DV)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _two_sum(a, b):
    """``(hi, lo)`` with ``hi = fl(a + b)`` and ``hi + lo == a + b`` exactly (Knuth's
    two-sum: no assumption on the operands' sizes, no branch)."""
    hi = a + b
    b_part = hi - a
    a_part = hi - b_part
    lo = (a - a_part) + (b - b_part)
    return hi, lo


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


@triton.autotune(configs=_configs(_FWD_TABLE, "BLOCK_M", "BLOCK_N"), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, LSE_LO, SLOPES, SINKS, Q_IDS, KV_IDS, KV_LO, KV_HI, VISITS,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, G, Tq, Tk, diag_off, left, right, qk_scale, sc_in, sc_out,
    Q_BUCKET, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SEG: tl.constexpr,
    COUNT_VISITS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DMIN: tl.constexpr, DMAX: tl.constexpr,  # the tile table's head-dim range (pruning only)
):
    """One program per (query block, batch, head).

    ``SINKS`` (H,) float32, ``Q_IDS`` (B, Tq) / ``KV_IDS`` (B, Tk) int32 segment ids and
    ``KV_LO``/``KV_HI`` (B, Tq) int32, each query's key span, are read only under
    ``HAS_SINKS`` / ``HAS_SEG``. ``COUNT_VISITS`` (tests, benchmarks) stores the number of
    key blocks each program visits, and how many there are, at ``VISITS[program, 0:2]``.
    """
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

    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + off_b * H + off_h)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:
        # The sink is a key with logit sink[h] and no value: it starts the online softmax
        # (m = sink, l = exp(sink - m) = 1); a sink of -inf is no sink (l = 0).
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(SINKS + off_h)
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    ids_q = _load_ids(Q_IDS + off_b * Tq, offs_m, Tq, HAS_SEG)
    kv_ids = KV_IDS + off_b * Tk
    span_lo, span_hi = _segment_span(KV_LO + off_b * Tq, KV_HI + off_b * Tq, offs_m, Tq, Tk,
                                     HAS_SEG)
    lo, full_lo, full_hi, hi = _key_ranges(m0, Tk, diag_off, left, right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    visits = 0
    # Three passes: band-cut blocks, full blocks (no mask arithmetic), band/end-cut blocks.
    for region in tl.static_range(3):
        start, stop = _region(region, lo, full_lo, full_hi, hi)
        if HAS_SEG:
            start, stop = _clip(start, stop, span_lo, span_hi, BLOCK_N)
        if COUNT_VISITS:
            visits += tl.maximum(stop - start + BLOCK_N - 1, 0) // BLOCK_N
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_dk, offs_dv, start, stop, Tk, diag_off, left, right,
            qk_scale, sc_in, sc_out, slope, ids_q, kv_ids, Dk, Dv, BLOCK_DK, BLOCK_DV,
            BLOCK_N, region != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_SEG,
            PRECISION)
    if COUNT_VISITS:
        program = (off_bh * tl.num_programs(0) + start_m).to(tl.int64) * 2
        tl.store(VISITS + program, visits)
        tl.store(VISITS + program + 1, (Tk + BLOCK_N - 1) // BLOCK_N)

    # A row with no allowed key (and no sink) has l = 0: output 0 and LSE -inf, never 0/0.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse_hi, lse_lo = _two_sum(tl.where(empty, 0.0, m_i), tl.log(l_safe))
    row = off_bh.to(tl.int64) * Tq + offs_m
    tl.store(LSE + row, tl.where(empty, float("-inf"), lse_hi), mask=offs_m < Tq)
    tl.store(LSE_LO + row, lse_lo, mask=offs_m < Tq)
    o_ptrs = (O + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < Dv))
