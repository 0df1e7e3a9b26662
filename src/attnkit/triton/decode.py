"""Decoding attention: a few new queries against a long KV cache (split-K, merged by LSE).

With ``Tq`` of 1 to a few tokens the work is reading the cache: ``B * Hkv * cache_len * (Dk
+ Dv)`` elements, once. One program per (key chunk, batch, KV head) streams its chunk of K
and V a single time for all ``G = H / Hkv`` query heads of the group and all ``Tq``
queries (packed as the rows of one tile), and writes a float32 partial output and its LSE.
A second tiny kernel merges the chunks exactly::

    lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * out_s

The cache is read in place through its strides (a ``KVCache`` of capacity ``C`` holding
``cache_len`` valid positions is never sliced or copied). Each batch row may hold its own
length (``cache_len`` a ``(B,)`` tensor, read by the kernel: no host synchronisation).
Scores go through the same pipeline as :func:`attnkit.triton.flash_attention` (scale,
softcap, then the causal band and an optional window); sinks join at the merge, as one
more partial with output 0 and LSE ``sink``.
"""

from __future__ import annotations

import math
import operator

import torch
import triton
import triton.language as tl

from ..spec import LOG2E, check_qkv, check_softcap, check_window, default_scale
from ._kernels import LN2, _scores, first_only, interpreting
from ._launch import (
    _batch_slices,
    _check_head_dims,
    _check_tensors,
    _int32_offsets,
    _int32_overflows,
    _padded,
    _precision,
)
from ._variants import sinks_float32

__all__ = ["decode_attention"]


def _decode_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bn, w, s in [(64, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 3)]
    ]


@triton.autotune(configs=_decode_configs(), key=["K_BUCKET", "BLOCK_DK", "BLOCK_DV", "BLOCK_R"],
                 prune_configs_by={"early_config_prune": lambda configs, *a, **k: first_only(
                     configs)})
@triton.jit
def _decode_split_kernel(
    Q, K, V, O_PART, LSE_PART, LENS,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    Hkv, G, Tq, capacity, chunk, num_splits, left, right, qk_scale2, sc_in, sc_out2, K_BUCKET,
    Dk: tl.constexpr, Dv: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_R: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (key chunk, batch, KV head, row block). ``LENS`` (B,) int32: each
    batch row's cache length, clamped to ``[0, capacity]``. The chunks tile the keys from
    the first one any query may see (``len - Tq - left`` under a window, else 0)."""
    split = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // Hkv).to(tl.int64)
    off_hkv = (off_bh % Hkv).to(tl.int64)

    # Rows of the tile: (group head g, query t) pairs, r = g * Tq + t.
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = r < G * Tq
    g = r // Tq
    t = r % Tq
    off_h = off_hkv * G + g
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + off_b * stride_qb + off_h[:, None] * stride_qh + t[:, None] * stride_qt
                + offs_dk[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_dk[None, :] < Dk), other=0.0)
    cache_len = tl.minimum(tl.maximum(tl.load(LENS + off_b), 0), capacity)
    # Bottom-right causal among the new queries: query t's diagonal key is t + len - Tq;
    # it sees keys j <= diag + right (right <= 0: causal), and j >= diag - left.
    diag = t + cache_len - Tq
    first = 0
    if HAS_LEFT:
        first = tl.maximum(cache_len - Tq - left, 0)
    start = first + split * chunk
    stop = tl.minimum(start + chunk, cache_len)
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_dk[:, None] * stride_kd,
                     mask=(offs_n[None, :] < stop) & (offs_dk[:, None] < Dk), other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=(offs_n[:, None] < stop) & (offs_dv[None, :] < Dv), other=0.0)
        s2, _ = _scores(tl.dot(q, kt, input_precision=PRECISION), t[:, None], offs_n[None, :],
                        0, qk_scale2, sc_in, sc_out2, 0.0, HAS_SOFTCAP, False)
        keep = (offs_n[None, :] < stop) & (offs_n[None, :] <= diag[:, None] + right)
        if HAS_LEFT:
            keep = keep & (offs_n[None, :] >= diag[:, None] - left)
        s2 = tl.where(keep, s2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no exp2(-inf - -inf)
        p = tl.exp2(s2 - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    # Partials are (B, H, Tq, num_splits[, Dv]) float32, contiguous.
    part_row = ((off_b * (Hkv * G) + off_h) * Tq + t) * num_splits + split
    tl.store(LSE_PART + part_row, lse, mask=row_ok)
    tl.store(O_PART + part_row[:, None] * BLOCK_DV + offs_dv[None, :], out,
             mask=row_ok[:, None])


@triton.jit
def _decode_merge_kernel(O_PART, LSE_PART, O, LSE, SINKS, H, Tq, num_splits,
                         Dv: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
                         HAS_SINKS: tl.constexpr):
    """One program per (b, h, t) row: combine the chunk partials by their LSEs.

    The splits are walked ``BLOCK_S`` at a time (two passes: the max LSE, then the
    weighted sum), so a few hundred splits never become one huge register tile. A sink
    (``SINKS`` (H,) float32) is one more partial: LSE ``sink[h]``, output 0.
    """
    row = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_DV)
    z = float("-inf")
    if HAS_SINKS:
        z = tl.load(SINKS + (row // Tq) % H)
    m_vec = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits,
                        other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse_s)
    m = tl.maximum(tl.max(m_vec, 0), z)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w_vec = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_ok = offs_s < num_splits
        lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=s_ok, other=float("-inf"))
        w = tl.exp(lse_s - m_use)  # 0 for empty chunks
        w_vec = w_vec + w
        o_s = tl.load(O_PART + (row * num_splits + offs_s)[:, None] * BLOCK_DV + offs_d[None, :],
                      mask=s_ok[:, None], other=0.0)
        acc = acc + tl.sum(o_s * w[:, None], 0)
    total = tl.sum(w_vec, 0)
    if HAS_SINKS:
        total = total + tl.exp(z - m_use)  # 0 for a sink of -inf
    empty = total == 0.0
    out = acc / tl.where(empty, 1.0, total)
    lse = tl.where(empty, float("-inf"), m_use + tl.log(tl.where(empty, 1.0, total)))
    tl.store(O + row * Dv + offs_d, out.to(O.dtype.element_ty), mask=offs_d < Dv)
    tl.store(LSE + row, lse)


def _merge_block(splits: int) -> int:
    """Splits the merge kernel reads at a time (a power of two, at most 16 under the
    interpreter so that the tests walk several blocks, 32 on a GPU)."""
    return max(2, min(16 if interpreting() else 32, triton.next_power_of_2(splits)))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _split_plan(cache_len: int, programs_per_split: int, device: torch.device,
                num_splits: int | None) -> tuple[int, int]:
    """``(chunk, num_splits)`` with ``num_splits * chunk >= cache_len``, no empty chunk."""
    if num_splits is None:
        # Enough programs for ~2 waves of the chip, but chunks of at least 256 keys so
        # each program streams a useful run of the cache; chunks are multiples of 128.
        want = max(1, math.ceil(2 * _num_sms(device) / programs_per_split))
        want = min(want, max(1, cache_len // 256))
        chunk = triton.cdiv(triton.cdiv(cache_len, want), 128) * 128
    else:
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        chunk = triton.cdiv(cache_len, num_splits)
    return chunk, triton.cdiv(cache_len, chunk)


def _lengths(cache_len: object, B: int, cap: int, device: torch.device
             ) -> tuple[torch.Tensor, int]:
    """``(lens (B,) int32 on device, longest)``: ``cache_len`` as one length per batch
    row, and the most keys any row can hold (``cache_len`` itself for an int, else the
    capacity: a tensor's values are not read back to the host)."""
    if isinstance(cache_len, torch.Tensor):
        if cache_len.is_floating_point() or cache_len.is_complex() or cache_len.dtype == \
                torch.bool:
            raise TypeError(f"cache_len must be an int or an integer tensor, got {cache_len.dtype}")
        if tuple(cache_len.shape) not in ((), (B,)):
            raise ValueError(f"cache_len must be an int or a (B,) = ({B},) tensor, got shape "
                             f"{tuple(cache_len.shape)}")
        lens = cache_len.to(device=device, dtype=torch.int32).expand(B).contiguous()
        return lens, cap
    try:
        n = operator.index(cache_len)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"cache_len must be an int or a (B,) integer tensor, got "
                        f"{type(cache_len).__name__}") from None
    if not 0 <= n <= cap:
        raise ValueError(f"cache_len={n} outside [0, capacity={cap}]")
    return torch.full((B,), n, dtype=torch.int32, device=device), n


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_len: int | torch.Tensor,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    window: tuple[int | None, int | None] | None = None,
    return_lse: bool = False,
    num_splits: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``Tq`` new queries over the first ``cache_len`` cache positions.

    The queries are the last ``Tq`` positions of the sequence (their own K/V already
    written into the cache), so causality is bottom-right: query ``t`` sees keys
    ``j <= t + cache_len - Tq``. Equal to ``flash_attention(q, k_cache[:, :, :cache_len],
    v_cache[:, :, :cache_len], causal=True, softcap=softcap, sinks=sinks, window=window)``
    without slicing or copying the cache (per batch row when lengths differ).

    Args:
        q: ``(B, H, Tq, Dk)``, small ``Tq``.
        k_cache: ``(B, Hkv, capacity, Dk)`` (e.g. ``KVCache.k``); ``H % Hkv == 0``.
        v_cache: ``(B, Hkv, capacity, Dv)``.
        cache_len: valid positions, ``0 <= cache_len <= capacity`` (``KVCache.length``):
            an int, or a ``(B,)`` integer tensor (ragged batches). Tensor values are not
            read back to the host (no synchronisation): values outside ``[0, capacity]``
            are clamped there instead of raising.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: scores -> ``softcap * tanh(scores / softcap)``.
        sinks: ``(H,)`` float logits, a value-less column in each softmax denominator.
        window: ``(left, right)`` around query ``t``'s diagonal key ``t + cache_len - Tq``
            (``right`` is capped at 0: decoding is causal); a left side reads only the
            last ``Tq + left`` positions.
        return_lse: also return the natural-log LSE ``(B, H, Tq)`` float32.
        num_splits: key chunks to split into (default: sized to fill the GPU).

    Returns:
        ``out (B, H, Tq, Dv)`` in q's dtype, or ``(out, lse)``.
    """
    _check_tensors(q=q, k_cache=k_cache, v_cache=v_cache)
    # The cache is k and v of the fit rule, its capacity C their key length.
    check_qkv(q, k_cache, v_cache, batched=True)
    B, H, Tq, Dk = q.shape
    Hkv, cap, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    _check_head_dims(Dk, Dv)
    lens, longest = _lengths(cache_len, B, cap, q.device)
    win = check_window(window)
    left, right = (None, None) if win is None else win
    reach = cap + Tq  # a side wider than this keeps or drops every key (int32 safety)
    right = 0 if right is None else max(-reach, min(right, 0))
    if left is not None:
        left = max(-reach, min(reach, left))
        longest = min(longest, max(Tq + left, 0))  # keys [len - Tq - left, len)
    opts = dict(scale=default_scale(scale, Dk), softcap=check_softcap(softcap),
                sinks=sinks_float32(sinks, H, q.device), left=left, right=right,
                num_splits=num_splits)
    if q.numel() == 0:
        out = torch.zeros((B, H, Tq, Dv), dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, Tq), float("-inf"), dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    parts = _batch_slices(B, Hkv)  # grid axis 1 holds B * Hkv programs (CUDA cap 65535)
    if parts is None:
        out, lse = _decode(q, k_cache, v_cache, lens, longest, **opts)
    else:
        outs = [_decode(q[b], k_cache[b], v_cache[b], lens[b], longest, **opts)
                for b in parts]
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([x for _, x in outs])
    return (out, lse) if return_lse else out


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            lens: torch.Tensor, longest: int, *, scale: float, softcap: float | None,
            sinks: torch.Tensor | None, left: int | None, right: int,
            num_splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The two launches for checked arguments: ``longest`` keys at most per row, from the
    first one the window lets any query see."""
    B, H, Tq, Dk = q.shape
    Hkv, cap, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    G = H // Hkv
    out = torch.empty((B, H, Tq, Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    # In-slice offsets are int32 in the kernel: a cache whose (position, dim) span passes
    # 2^31 (a (B, C, Hkv, D) view with C * Hkv * D >= 2^31) is read through a dense copy
    # (correct, though the copy costs as much as the read).
    q = _int32_offsets(q)
    k_cache, v_cache = (c.contiguous() if _int32_overflows(c) else c for c in (k_cache, v_cache))

    rows = G * Tq
    block_r = max(16, min(64, triton.next_power_of_2(rows)))  # tl.dot needs M >= 16
    row_blocks = triton.cdiv(rows, block_r)
    chunk, splits = _split_plan(max(longest, 1), B * Hkv * row_blocks, q.device, num_splits)
    block_dk, block_dv = _padded(Dk), _padded(Dv)
    o_part = torch.empty((B, H, Tq, splits, block_dv), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((B, H, Tq, splits), dtype=torch.float32, device=q.device)
    _decode_split_kernel[(splits, B * Hkv, row_blocks)](
        q, k_cache, v_cache, o_part, lse_part, lens,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        Hkv, G, Tq, cap, chunk, splits, 0 if left is None else left, right, scale * LOG2E,
        0.0 if softcap is None else scale / softcap, 0.0 if softcap is None else softcap * LOG2E,
        triton.next_power_of_2(max(longest, 1)),
        Dk=Dk, Dv=Dv, BLOCK_DK=block_dk, BLOCK_DV=block_dv, BLOCK_R=block_r,
        HAS_LEFT=left is not None, HAS_SOFTCAP=softcap is not None,
        PRECISION=_precision(q.dtype),
    )
    _decode_merge_kernel[(B * H * Tq,)](
        o_part, lse_part, out, lse, lse_part if sinks is None else sinks, H, Tq, splits,
        Dv=Dv, BLOCK_DV=block_dv, BLOCK_S=_merge_block(splits), HAS_SINKS=sinks is not None,
    )
    return out, lse
