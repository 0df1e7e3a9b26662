"""Blockwise attention with an online softmax (the FlashAttention algorithm), in NumPy.

For each block of queries we walk over blocks of keys, keeping per query row

    m_i    the running maximum of the scores seen so far,
    l_i    the running sum of ``exp(score - m_i)``,
    acc    the running sum of ``exp(score - m_i) * v``.

When a new key block raises the maximum from ``m_old`` to ``m_new``, the old sums were
computed relative to ``m_old``; multiplying them by ``alpha = exp(m_old - m_new)`` rebases
them. At the end ``out = acc / l_i`` and ``lse = m_i + log(l_i)``. Only a
``block_q x block_k`` tile of scores exists at any time, so memory is linear in T.

Key blocks that lie entirely outside the causal/window band are skipped, not masked.

Two partial results over disjoint key sets combine exactly through their log-sum-exps
(:func:`merge_partials`); ring attention and split-K decoding are built on that.
"""

from __future__ import annotations

import math
import numbers
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .attention import _floats, _grouped, _kv_grouped, _ungrouped, check_qkv
from .masks import Window
from .softmax import compute_dtype

__all__ = ["flash_attention", "merge_partials"]


def _band(
    i0: int, i1: int, j0: int, j1: int, offset: int, left: int | None, right: int | None
) -> np.ndarray | None:
    """Keep-mask of the tile rows ``[i0, i1)`` x cols ``[j0, j1)``, or None if all kept."""
    i = np.arange(i0, i1)[:, None] + offset  # the diagonal key of each query
    j = np.arange(j0, j1)[None, :]
    keep = np.ones((i1 - i0, j1 - j0), dtype=bool)
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    return None if keep.all() else keep


def _resolve_band(causal: bool, window: Window | None) -> tuple[int | None, int | None]:
    if window is not None and not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise TypeError(f"window must be a (left, right) pair, got {window!r}")
    left, right = (None, None) if window is None else window
    for name, side in (("left", left), ("right", right)):
        if side is not None and not isinstance(side, numbers.Integral):
            raise TypeError(f"window {name} must be an int or None, got {side!r}")
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    window: Window | None = None,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 256,
    num_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention computed block by block; equal to :func:`scaled_dot_product_attention`.

    Args:
        q: ``(..., H, Tq, Dk)``.
        k: ``(..., Hkv, Tk, Dk)`` (GQA when ``Hkv < H``).
        v: ``(..., Hkv, Tk, Dv)``.
        causal: bottom-right aligned causal mask.
        window: ``(left, right)`` band around the diagonal; None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        block_q, block_k: tile sizes. A tile holds every head's ``block_q x block_k``
            scores; 128 x 256 amortises the per-tile Python and ufunc overhead (64 x 64
            costs ~45% more CPU time at T=4096) while staying cache-sized.
        num_threads: query blocks run on this many threads (NumPy releases the GIL in
            BLAS and ufuncs). With more than one, limit BLAS to one thread per caller
            (``OPENBLAS_NUM_THREADS=1`` or threadpoolctl): BLAS threads started inside
            each worker oversubscribe the cores (measured 3-9x slower on a busy 2-core box).

    Returns:
        ``(out (..., H, Tq, Dv), lse (..., H, Tq))``: ``lse`` is the natural-log
        log-sum-exp of each row's scaled scores, ``-inf`` (and output 0) for a row with
        no allowed key. ``out`` has the input dtype, ``lse`` float32 or wider.
    """
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    G = check_qkv(q, k, v)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    dt = compute_dtype(np.result_type(q.dtype, k.dtype, v.dtype))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    left, right = _resolve_band(causal, window)

    qg = _grouped(q.astype(dt, copy=False), G)  # (..., Hkv, G, Tq, Dk)
    kg = _kv_grouped(k.astype(dt, copy=False), G)  # (..., Hkv, 1, Tk, Dk)
    vg = _kv_grouped(v.astype(dt, copy=False), G)  # (..., Hkv, 1, Tk, Dv)
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    offset = Tk - Tq  # bottom-right alignment: query i's diagonal key is i + offset
    lead = np.broadcast_shapes(qg.shape[:-2], kg.shape[:-2])
    out = np.zeros(lead + (Tq, Dv), dtype=dt)
    lse = np.full(lead + (Tq,), -np.inf, dtype=dt)

    # K^T laid out once (one K-sized copy, linear in T): each tile's q @ k^T then reads
    # contiguous rows, BLAS's fast path.
    kT = np.ascontiguousarray(np.swapaxes(kg, -1, -2))  # (..., Hkv, 1, Dk, Tk)

    def one_query_block(i0: int) -> None:
        i1 = min(i0 + block_q, Tq)
        qi = qg[..., i0:i1, :] * dt.type(scale)
        m_i = np.full(lead + (i1 - i0,), -np.inf, dtype=dt)
        l_i = np.zeros(lead + (i1 - i0,), dtype=dt)
        acc = np.zeros(lead + (i1 - i0, Dv), dtype=dt)
        tile = np.empty(lead + (i1 - i0, block_k), dtype=dt)  # scores, reused per key block
        # Only key blocks that meet the band [i0 + offset - left, i1 - 1 + offset + right].
        j_lo = 0 if left is None else max(0, i0 + offset - left)
        j_hi = Tk if right is None else min(Tk, i1 - 1 + offset + right + 1)
        for j0 in range((j_lo // block_k) * block_k, j_hi, block_k):
            j1 = min(j0 + block_k, Tk)
            # s lives in this block's private buffer, so the steps below work on it in
            # place: every extra pass over a tile costs ~20% of its matmul.
            s = np.matmul(qi, kT[..., j0:j1], out=tile[..., : j1 - j0])  # (..., bq, bk)
            keep = _band(i0, i1, j0, j1, offset, left, right)
            if keep is not None:
                np.copyto(s, -np.inf, where=~keep)
            m_new = np.maximum(m_i, s.max(axis=-1))
            # A row with nothing allowed yet keeps m = -inf; rebase against 0 instead.
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dt, copy=False)
            s -= m_safe[..., None]
            p = np.exp(s, out=s)  # exp(score - m), in the score buffer
            alpha = np.exp(m_i - m_safe)  # exp(-inf) = 0 on the first allowed block
            l_i *= alpha
            l_i += p.sum(axis=-1)
            acc *= alpha[..., None]
            acc += p @ vg[..., j0:j1, :]
            m_i = m_new
        # l_i == 0 exactly when a row saw no allowed key: output 0, lse -inf.
        out[..., i0:i1, :] = np.divide(
            acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] != 0
        )
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l_i != 0, m_i + np.log(l_i), -np.inf)

    starts = range(0, Tq, block_q)
    if num_threads > 1 and len(starts) > 1:
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            list(pool.map(one_query_block, starts))
    else:
        for i0 in starts:
            one_query_block(i0)

    out_dt = np.result_type(q.dtype, k.dtype, v.dtype)
    out_dt = out_dt if np.issubdtype(out_dt, np.floating) else np.dtype(np.float64)
    out = _ungrouped(out, G)
    lse = lse.reshape(out.shape[:-1])
    return out.astype(out_dt, copy=False), lse


def merge_partials(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Combine attention over two disjoint key sets into attention over their union.

    With ``lse = log(exp(lse_a) + exp(lse_b))`` each side carries the share
    ``exp(lse_side - lse)`` of the total softmax mass, so
    ``out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b``.
    ``np.logaddexp`` is stable for large LSE; a side with ``lse = -inf`` (no allowed key)
    contributes nothing, and both sides ``-inf`` give output 0 and ``lse = -inf``.

    Args:
        out_a, out_b: ``(..., Tq, Dv)``.
        lse_a, lse_b: ``(..., Tq)``.

    Returns:
        ``(out (..., Tq, Dv), lse (..., Tq))``.
    """
    out_a, out_b = np.asarray(out_a), np.asarray(out_b)
    lse_a, lse_b = np.asarray(lse_a), np.asarray(lse_b)
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(
            f"partials do not match: out_a {out_a.shape}, lse_a {lse_a.shape}, out_b "
            f"{out_b.shape}, lse_b {lse_b.shape}; expected out (..., Tq, Dv), lse (..., Tq)"
        )
    lse = np.logaddexp(lse_a, lse_b)
    finite = ~np.isneginf(lse)
    safe = np.where(finite, lse, 0.0)
    w_a = np.where(finite & ~np.isneginf(lse_a), np.exp(lse_a - safe), 0.0)[..., None]
    w_b = np.where(finite & ~np.isneginf(lse_b), np.exp(lse_b - safe), 0.0)[..., None]
    # where(), not a bare product: an empty side's output never leaks into the result
    # (its 0 * nan / 0 * inf products are discarded, so they need not warn either).
    with np.errstate(invalid="ignore"):
        out = np.where(w_a != 0, w_a * out_a, 0.0) + np.where(w_b != 0, w_b * out_b, 0.0)
    return out.astype(np.result_type(out_a.dtype, out_b.dtype), copy=False), lse
