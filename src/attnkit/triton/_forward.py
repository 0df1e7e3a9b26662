"""The forward kernel of fused attention: online softmax over key blocks, one program per
(query block, batch, head). Conventions and shared pieces: :mod:`attnkit.triton._kernels`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._kernels import (
    _KEY,
    LN2,
    LOG2E,
    _band,
    _configs,
    _key_ranges,
    _load_tile,
    _prune,
    _region,
    _scores,
)


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
        slope2 = tl.load(SLOPES + off_b * H + off_h) * LOG2E

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
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    tl.store(LSE + off_bh.to(tl.int64) * Tq + offs_m, lse, mask=offs_m < Tq)
    o_ptrs = (O + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < Dv))
