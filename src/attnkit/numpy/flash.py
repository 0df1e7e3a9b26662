"""Blockwise attention with an online softmax (the FlashAttention algorithm), in NumPy.

For each block of queries we walk over blocks of keys, keeping per query row

    m_i    the running maximum of the scores seen so far,
    l_i    the running sum of ``exp(score - m_i)``,
    acc    the running sum of ``exp(score - m_i) * v``.

When a new key block raises the maximum from ``m_old`` to ``m_new``, the old sums were
computed relative to ``m_old``; multiplying them by ``alpha = exp(m_old - m_new)`` rebases
them. At the end ``out = acc / l_i`` and ``lse = m_i + log(l_i)``. Only a
``block_q x block_k`` tile of scores exists at any time, so memory is linear in T.

Key blocks that lie entirely outside the causal/window band, or whose keys share no
segment id with the block's queries, are skipped, not masked. With ``softcap`` each tile's
scores pass through ``softcap * tanh(s / softcap)``; with ``sinks`` the sink logit joins
each row's running sums once, at the end (:mod:`attnkit.numpy.variants`).

Two partial results over disjoint key sets combine exactly through their log-sum-exps
(:func:`merge_partials`); ring attention and split-K decoding are built on that.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..spec import (
    LN2,
    LOG2E,
    Window,
    check_qkv,
    check_sinks,
    check_softcap,
    default_scale,
    resolve_band,
    scores_shape,
)
from .attention import _floats
from .groups import fold_grouped, grouped, kv_grouped, sum_to_shape, ungrouped
from .masks import segment_mask
from .nonfinite import finite_or_zero, weighted_values
from .softmax import compute_dtype, result_dtype
from .variants import sinks_backward

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


class _Problem(NamedTuple):
    """What the blockwise forward and backward share, checked once."""

    G: int  # H // Hkv
    dt: np.dtype  # compute dtype
    scale: float
    left: int | None  # the causal/window band around the diagonal; None = unbounded
    right: int | None
    qg: np.ndarray  # (..., Hkv, G, Tq, Dk), compute dtype
    kg: np.ndarray  # (..., Hkv, 1, Tk, Dk)
    vg: np.ndarray  # (..., Hkv, 1, Tk, Dv)
    lead: tuple[int, ...]  # broadcast leading dims of qg and kg, (..., Hkv, G)
    softcap: float | None
    sink: np.ndarray | None  # sinks in base 2, (..., Hkv, G, 1) against lead, or None
    same_segment: np.ndarray | None  # bool (B, 1, ..., Tq, Tk) against lead + (Tq, Tk)


def _problem(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool | str, window: Window | None,
    scale: float | None, block_q: int, block_k: int, softcap: float | None = None,
    sinks: np.ndarray | None = None, segment_ids: object = None,
) -> _Problem:
    G = check_qkv(q, k, v)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    dt = compute_dtype(np.result_type(q.dtype, k.dtype, v.dtype))
    Tq, Tk = q.shape[-2], k.shape[-2]
    left, right = resolve_band(causal, window, Tq, Tk)
    qg = grouped(q.astype(dt, copy=False), G)
    kg = kv_grouped(k.astype(dt, copy=False), G)
    vg = kv_grouped(v.astype(dt, copy=False), G)
    lead = np.broadcast_shapes(qg.shape[:-2], kg.shape[:-2])
    shape = scores_shape(q, k, G)
    sink = None
    if sinks is not None:
        H = shape[-3] if len(shape) >= 3 else 1
        check_sinks(sinks, H)
        # (H,) -> (Hkv, G, 1) with GQA, (H, 1) without: the head axes of lead, one column.
        z = np.asarray(sinks).astype(dt, copy=False) * dt.type(LOG2E)
        sink = z.reshape((H // G, G, 1) if G > 1 else (H, 1) if len(shape) >= 3 else (1,))
    same_segment = None
    if segment_ids is not None:
        m = segment_mask(segment_ids, shape)  # (B, 1, ..., Tq, Tk) against the scores
        # the scores' head axis H is (Hkv, G) in lead: one more broadcast axis
        same_segment = m.reshape(m.shape[:1] + (1,) * (len(lead) - 1) + m.shape[-2:])
    return _Problem(
        G, dt, default_scale(scale, q.shape[-1]), left, right, qg, kg, vg, lead,
        check_softcap(softcap), sink, same_segment,
    )


def _tile_keep(
    p: _Problem, i0: int, i1: int, j0: int, j1: int, offset: int
) -> tuple[bool, np.ndarray | None]:
    """``(skip, keep)`` of one tile: skip when no query of the tile may attend any key
    of it (segments that do not meet); else the band ANDed with the segment mask, None
    when everything is kept."""
    keep = _band(i0, i1, j0, j1, offset, p.left, p.right)
    if p.same_segment is None:
        return False, keep
    seg = p.same_segment[..., i0:i1, j0:j1]
    if not seg.any():
        return True, None
    keep = seg if keep is None else seg & keep
    return False, (None if keep.all() else keep)


def _capped(s: np.ndarray, softcap: float | None, to_base2: float) -> np.ndarray:
    """A tile of natural-log scores ``s`` soft-capped in place, then times ``to_base2``."""
    if softcap is None:
        return s
    np.tanh(np.divide(s, softcap, out=s), out=s)
    return np.multiply(s, softcap * to_base2, out=s)


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool | str = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    segment_ids: object = None,
    block_q: int = 64,
    block_k: int = 64,
    num_threads: int = 1,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention computed block by block; equal to :func:`scaled_dot_product_attention`.

    Args:
        q: ``(..., H, Tq, Dk)``.
        k: ``(..., Hkv, Tk, Dk)`` (GQA when ``Hkv < H``).
        v: ``(..., Hkv, Tk, Dv)``.
        causal: True or ``"bottom_right"``, or ``"top_left"`` (as
            :func:`scaled_dot_product_attention`).
        window: ``(left, right)`` band around the bottom-right diagonal; None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap, sinks, segment_ids: as :func:`scaled_dot_product_attention`.
        block_q, block_k: tile sizes. A tile holds every head's ``block_q x block_k``
            scores. The 64 x 64 default shows the algorithm at small sizes; for speed
            at long T pass 128 x 256, which amortises the per-tile Python and ufunc
            overhead (64 x 64 costs ~45% more CPU time at T=4096) while staying
            cache-sized.
        num_threads: query blocks run on this many threads (NumPy releases the GIL in
            BLAS and ufuncs). With more than one, limit BLAS to one thread per caller
            (``OPENBLAS_NUM_THREADS=1`` or threadpoolctl): BLAS threads started inside
            each worker oversubscribe the cores (measured 3-9x slower on a busy 2-core box).
        return_lse: also return the log-sum-exp (as :func:`attnkit.triton.flash_attention`
            does: ``out`` alone by default, ``(out, lse)`` on request).

    Returns:
        ``out (..., H, Tq, Dv)`` in the input dtype, or ``(out, lse (..., H, Tq))`` with
        ``return_lse=True``: ``lse`` is the natural-log log-sum-exp of each row's scaled
        scores (float32 or wider), ``-inf`` (and output 0) for a row with no allowed key.
        With ``sinks`` the LSE includes the sink (a row with no allowed key: the sink).
    """
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    prob = _problem(q, k, v, causal, window, scale, block_q, block_k, softcap, sinks, segment_ids)
    G, dt, scale, left, right, qg, kg, vg, lead = prob[:9]
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    offset = Tk - Tq  # bottom-right alignment: query i's diagonal key is i + offset
    out = np.zeros(lead + (Tq, Dv), dtype=dt)
    lse = np.full(lead + (Tq,), -np.inf, dtype=dt)

    # K^T laid out once (one K-sized copy, linear in T): each tile's q @ k^T then reads
    # contiguous rows, BLAS's fast path.
    kT = np.ascontiguousarray(np.swapaxes(kg, -1, -2))  # (..., Hkv, 1, Dk, Tk)

    ones = np.ones(block_k, dtype=dt)

    def one_query_block(i0: int) -> None:
        i1 = min(i0 + block_q, Tq)
        # Scores in base 2 (log2(e) folded into the scale): NumPy's exp2 loop is ~1.5x
        # faster than its exp, and exp2(s*log2(e) - m) is the same softmax. m_i is in
        # base-2 units too; lse goes back to natural log at the end.
        # With softcap, tanh needs the natural-log score: base 2 comes after the cap.
        qi = qg[..., i0:i1, :] * dt.type(scale * (LOG2E if prob.softcap is None else 1.0))
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
            skip, keep = _tile_keep(prob, i0, i1, j0, j1, offset)
            if skip:
                continue
            s = np.matmul(qi, kT[..., j0:j1], out=tile[..., : j1 - j0])  # (..., bq, bk)
            s = _capped(s, prob.softcap, LOG2E)
            if keep is not None:
                np.copyto(s, -np.inf, where=~keep)
            m_new = np.maximum(m_i, s.max(axis=-1))
            # A row with nothing allowed yet keeps m = -inf; rebase against 0 instead.
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dt, copy=False)
            s -= m_safe[..., None]
            p = np.exp2(s, out=s)  # exp(score - m), in the score buffer
            alpha = np.exp2(m_i - m_safe)  # exp(-inf) = 0 on the first allowed block
            l_i *= alpha
            l_i += p @ ones[: j1 - j0]  # row sums; a BLAS matvec reads p ~3x faster than sum()
            acc *= alpha[..., None]
            acc += weighted_values(p, vg[..., j0:j1, :], keep)
            m_i = m_new
        if prob.sink is not None:  # the sink's column joins the sums once, rebased
            m_new = np.maximum(m_i, prob.sink)
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dt, copy=False)
            alpha = np.exp2(m_i - m_safe)
            l_i = l_i * alpha + np.exp2(prob.sink - m_safe)
            acc *= alpha[..., None]
            m_i = m_new
        # l_i == 0 exactly when a row saw no allowed key (and no sink): output 0, lse -inf.
        out[..., i0:i1, :] = np.divide(
            acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] != 0
        )
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l_i != 0, m_i * dt.type(LN2) + np.log(l_i), -np.inf)

    starts = range(0, Tq, block_q)
    if num_threads > 1 and len(starts) > 1:
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            list(pool.map(one_query_block, starts))
    else:
        for i0 in starts:
            one_query_block(i0)

    out = ungrouped(out, G)
    out = out.astype(result_dtype(np.result_type(q.dtype, k.dtype, v.dtype)), copy=False)
    return (out, lse.reshape(out.shape[:-1])) if return_lse else out


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


# -- backward -----------------------------------------------------------------------------


def flash_attention_backward(
    d_out: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    *,
    causal: bool | str = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    segment_ids: object = None,
    block_q: int = 64,
    block_k: int = 64,
) -> tuple[np.ndarray, ...]:
    """VJP of :func:`flash_attention`, block by block, from the saved ``out`` and ``lse``.

    The probabilities are recomputed tile by tile as ``P = exp(S - lse)`` (exactly the
    normalised softmax, since ``lse`` is each row's log normaliser). For ``O = P V``:
    ``dV = P^T dO`` and ``dP = dO V^T``; the softmax backward
    ``dS = P * (dP - rowsum(dP * P))`` needs one number per row,
    ``D_i = rowsum(dP * P) = rowsum(dO * (P V)) = rowsum(dO * O)``, computed once up front.
    Then ``dQ = scale dS K`` and ``dK = scale dS^T Q``. Only ``block_q x block_k`` tiles
    exist, so memory is linear in T; key blocks outside the causal/window band are skipped
    as in the forward. A row with ``lse = -inf`` (no allowed key) has ``P = 0`` and gets
    zero gradients. Softcap multiplies ``dS`` by ``1 - tanh^2`` (recomputed per tile);
    with sinks ``lse`` includes the sink, so ``P`` is already the sink-normalised weight,
    ``dS`` keeps its form and the sink of head ``h`` gets ``-sum exp(z_h - lse) D_i``
    (:func:`attnkit.numpy.variants.sinks_backward`).

    Args:
        d_out: cotangent of ``out``, ``(..., H, Tq, Dv)``.
        q, k, v: the forward's inputs.
        out, lse: the forward's outputs.
        causal, window, scale, softcap, sinks, segment_ids, block_q, block_k: as given to
            the forward.

    Returns:
        ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``, in the compute dtype; with
        ``sinks``, ``(dq, dk, dv, d_sinks (H,))``.
    """
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    prob = _problem(q, k, v, causal, window, scale, block_q, block_k, softcap, sinks, segment_ids)
    G, dt, scale, left, right, qg, kg, vg, lead = prob[:9]
    Tq, Tk = q.shape[-2], k.shape[-2]
    heads = lead if G == 1 else lead[:-2] + (lead[-2] * G,)
    out_shape = heads + (Tq, v.shape[-1])
    d_out, out, lse = np.asarray(d_out), np.asarray(out), np.asarray(lse)
    if d_out.shape != out_shape or out.shape != out_shape or lse.shape != out_shape[:-1]:
        raise ValueError(
            f"expected d_out and out {out_shape} and lse {out_shape[:-1]}, got d_out "
            f"{d_out.shape}, out {out.shape}, lse {lse.shape}"
        )
    dog = grouped(d_out.astype(dt, copy=False), G)  # (..., Hkv, G, Tq, Dv)
    # D_i = rowsum(dO * O), one number per query row.
    delta = np.sum(dog * grouped(out.astype(dt, copy=False), G), axis=-1)  # (..., Hkv, G, Tq)
    # An empty row has lse = -inf; using +inf there makes exp(S - lse) = 0 with no inf - inf.
    lse_g = grouped(lse.astype(dt, copy=False)[..., None], G)[..., 0]
    lse_g = np.where(np.isneginf(lse_g), np.inf, lse_g)
    offset = Tk - Tq
    dq = np.zeros(lead + (Tq, q.shape[-1]), dtype=dt)
    dk = np.zeros(k.shape, dtype=dt)
    dv = np.zeros(v.shape, dtype=dt)
    s_scale = dt.type(scale)
    # The dS matmuls use copies with NaN/inf zeroed (see finite_or_zero); the scores use
    # the originals, so an attended NaN still reaches dS.
    q_mm, k_mm, v_mm = finite_or_zero(qg), finite_or_zero(kg), finite_or_zero(vg)

    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = qg[..., i0:i1, :]
        do_i = dog[..., i0:i1, :]
        lse_i = lse_g[..., i0:i1, None]
        delta_i = delta[..., i0:i1, None]
        dq_i = np.zeros(lead + (i1 - i0, q.shape[-1]), dtype=dt)
        j_lo = 0 if left is None else max(0, i0 + offset - left)
        j_hi = Tk if right is None else min(Tk, i1 - 1 + offset + right + 1)
        for j0 in range((j_lo // block_k) * block_k, j_hi, block_k):
            j1 = min(j0 + block_k, Tk)
            skip, keep = _tile_keep(prob, i0, i1, j0, j1, offset)
            if skip:
                continue
            kj = kg[..., j0:j1, :]
            s = (qi * s_scale) @ np.swapaxes(kj, -1, -2)  # (..., bq, bk), as in the forward
            tanh = None
            if prob.softcap is not None:
                tanh = np.tanh(s / dt.type(prob.softcap))
                s = tanh * dt.type(prob.softcap)
            if keep is not None:
                s = np.where(keep, s, -np.inf)
            p = np.exp(s - lse_i)  # the forward's probabilities, recomputed
            dp = do_i @ np.swapaxes(v_mm[..., j0:j1, :], -1, -2)
            ds = p * (dp - delta_i)
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)  # through the cap; masked entries have p = 0
            dq_i += ds @ k_mm[..., j0:j1, :]
            # sum over the G heads of each group and over broadcast batch dims
            # (..., Hkv, bk, Dv) and (..., Hkv, bk, Dk)
            dv_j = np.swapaxes(fold_grouped(p, G), -1, -2) @ fold_grouped(do_i, G)
            dk_j = np.swapaxes(fold_grouped(ds, G), -1, -2) @ fold_grouped(q_mm[..., i0:i1, :], G)
            dv[..., j0:j1, :] += sum_to_shape(dv_j, dv[..., j0:j1, :].shape)
            dk[..., j0:j1, :] += sum_to_shape(dk_j, dk[..., j0:j1, :].shape)
        dq[..., i0:i1, :] = dq_i
    dq = sum_to_shape(ungrouped(dq * s_scale, G), q.shape)
    if prob.sink is None:
        return dq, dk * s_scale, dv
    # exp(z - lse) per row; lse_g is +inf only where a row had neither key nor sink.
    sink_weight = np.exp(prob.sink * dt.type(LN2) - lse_g)
    H = len(sinks)  # type: ignore[arg-type]
    d_sinks = sinks_backward(
        ungrouped(sink_weight[..., None], G), ungrouped(delta[..., None], G), H
    )
    return dq, dk * s_scale, dv, d_sinks
