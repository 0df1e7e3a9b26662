"""Blockwise attention with an online softmax (the FlashAttention algorithm), in NumPy.

For each block of queries we walk over blocks of keys, keeping per query row

    m_i    the running maximum of the scores seen so far,
    l_i    the running sum of ``exp(score - m_i)``,
    acc    the running sum of ``exp(score - m_i) * v``.

When a new key block raises the maximum from ``m_old`` to ``m_new``, the old sums were
computed relative to ``m_old``; multiplying them by ``alpha = exp(m_old - m_new)`` rebases
them. At the end ``out = acc / l_i`` and ``lse = m_i + log(l_i)``. Only a
``block_q x block_k`` tile of scores exists at any time, so memory is linear in T.

Precision at large logits: the scores stay in natural units and ``score - m_i`` is formed
before anything is rounded at their magnitude (a score of 1e4 has a float32 spacing of
1e-3, which would become a 1e-3 relative error in every probability). The backward needs
the row's LSE to that precision too: ask for it in float64 (``lse_dtype``; :func:`attnkit.
numpy.vjp` does) and :func:`flash_attention_backward` recomputes ``P`` as exactly as the
forward had it, whatever the magnitude of the logits.

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
    Window,
    check_qkv,
    check_sinks,
    check_softcap,
    default_scale,
    resolve_band,
    scores_shape,
)
from ._plan import blas_threads_limited, plan
from .attention import _floats
from .groups import fold_grouped, grouped, kv_grouped, sum_to_shape, ungrouped
from .masks import segment_mask
from .merge import merge_partials
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


def _scaled_queries(qg: np.ndarray, i0: int, i1: int, scale: float) -> np.ndarray:
    """Query rows ``[i0, i1)`` times the scale: the one way the forward and the backward
    form the scores (``_scaled_queries(...) @ k^T``), so that the backward's recomputed
    scores are the forward's bit for bit, and so its probabilities match the saved LSE."""
    return qg[..., i0:i1, :] * qg.dtype.type(scale)


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
    sink: np.ndarray | None  # sinks (natural units), (..., Hkv, G, 1) against lead, or None
    same_segment: np.ndarray | None  # bool (B, 1, ..., Tq, Tk) against lead + (Tq, Tk)


def _problem(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool | str, window: Window | None,
    scale: float | None, softcap: float | None = None,
    sinks: np.ndarray | None = None, segment_ids: object = None,
) -> _Problem:
    G = check_qkv(q, k, v)
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
        z = np.asarray(sinks).astype(dt, copy=False)  # natural units, as the scores
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


# A block's row sums against a reference that is not its own max may reach this before the
# block is redone with its max (rebased): bounds how far exp(score - reference) may grow.
LAZY_SUM_LIMIT = 2.0**16


def _tile_scores(
    qi: np.ndarray, kT: np.ndarray, out: np.ndarray, keep: np.ndarray | None,
    softcap: float | None,
) -> np.ndarray:
    """One tile's natural-log scores ``qi @ kT`` in ``out``, soft-capped in place, ``-inf``
    where ``keep`` is False."""
    s = np.matmul(qi, kT, out=out)
    if softcap is not None:
        np.multiply(np.tanh(np.divide(s, softcap, out=s), out=s), softcap, out=s)
    if keep is not None:
        np.copyto(s, -np.inf, where=~keep)
    return s


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
    block_q: int | None = None,
    block_k: int | None = None,
    num_threads: int | None = None,
    return_lse: bool = False,
    lse_dtype: np.dtype | type | None = None,
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
        block_q, block_k: tile sizes; a tile holds every head's ``block_q x block_k``
            scores. None (the default) picks 256 x 512 for long sequences (at least two
            query blocks per worker) and 128 x 256 otherwise, clipped to the lengths:
            larger tiles amortise the per-tile Python and ufunc overhead (64 x 64 costs
            ~45% more CPU time at T=4096) while staying cache-sized (see
            :mod:`attnkit.numpy._plan`).
        num_threads: query blocks run on this many threads (NumPy releases the GIL in
            BLAS and ufuncs). None (the default) uses one per usable core, at most one
            per query block. With more than one, BLAS runs one thread per worker for the
            call (through threadpoolctl; its own threads inside each worker would
            oversubscribe the cores, measured 3-9x slower on a busy 2-core box); without
            threadpoolctl the default is one thread.
        return_lse: also return the log-sum-exp (as :func:`attnkit.triton.flash_attention`
            does: ``out`` alone by default, ``(out, lse)`` on request).
        lse_dtype: the returned LSE's dtype, never narrower than the statistics dtype
            (float32, float64 for float64 input, the default). ``np.float64`` carries the
            float32 row max and sum without rounding them together at the LSE's
            magnitude: what :func:`flash_attention_backward` and :func:`merge_partials`
            need for float32 gradients and merges that are exact at logits ~1e4.

    Returns:
        ``out (..., H, Tq, Dv)`` in the input dtype, or ``(out, lse (..., H, Tq))`` with
        ``return_lse=True``: ``lse`` is the natural-log log-sum-exp of each row's scaled
        scores (float32 or wider), ``-inf`` (and output 0) for a row with no allowed key.
        With ``sinks`` the LSE includes the sink (a row with no allowed key: the sink).
    """
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    prob = _problem(q, k, v, causal, window, scale, softcap, sinks, segment_ids)
    work = plan(q.shape[-2], k.shape[-2], block_q, block_k, num_threads)
    block_q, block_k = work.block_q, work.block_k
    G, dt, scale, left, right, qg, kg, vg, lead = prob[:9]
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    offset = Tk - Tq  # bottom-right alignment: query i's diagonal key is i + offset
    out = np.zeros(lead + (Tq, Dv), dtype=dt)
    lse_dt = np.result_type(dt, dt if lse_dtype is None else lse_dtype)
    lse = np.full(lead + (Tq,), -np.inf, dtype=lse_dt)

    # K^T laid out once (one K-sized copy, linear in T): each tile's q @ k^T then reads
    # contiguous rows, BLAS's fast path.
    kT = np.ascontiguousarray(np.swapaxes(kg, -1, -2))  # (..., Hkv, 1, Dk, Tk)

    ones = np.ones(block_k, dtype=dt)

    def one_query_block(i0: int) -> None:
        i1 = min(i0 + block_q, Tq)
        # Natural units throughout: scores folded into base 2 (log2(e) in the scale) are
        # rounded at their magnitude before the max is taken off, 1e-3 at 1e4 in float32.
        # (NumPy's float32 exp is as fast as exp2 here: no reason for base 2.)
        qi = _scaled_queries(qg, i0, i1, scale)
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
            s = _tile_scores(qi, kT[..., j0:j1], tile[..., : j1 - j0], keep, prob.softcap)
            if np.isfinite(m_i).all():
                # Every row has a reference already (an earlier block's max, a score
                # itself, so s - m is as exact as ever): exponentiate against it and skip
                # this block's max. Valid while no score rose far above its reference;
                # the row sums say so (NaN fails the test too), else the block is redone.
                np.subtract(s, m_i[..., None], out=s)
                with np.errstate(over="ignore"):  # an overflow fails the test below
                    p = np.exp(s, out=s)
                    l_blk = p @ ones[: j1 - j0]
                if np.all(l_blk <= LAZY_SUM_LIMIT):
                    l_i += l_blk
                    acc += weighted_values(p, vg[..., j0:j1, :], keep)
                    continue
                s = _tile_scores(qi, kT[..., j0:j1], tile[..., : j1 - j0], keep, prob.softcap)
            m_new = np.maximum(m_i, s.max(axis=-1))
            # A row with nothing allowed yet keeps m = -inf; rebase against 0 instead.
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dt, copy=False)
            s -= m_safe[..., None]
            p = np.exp(s, out=s)  # exp(score - m), in the score buffer
            alpha = np.exp(m_i - m_safe)  # exp(-inf) = 0 on the first allowed block
            l_i *= alpha
            l_i += p @ ones[: j1 - j0]  # row sums; a BLAS matvec reads p ~3x faster than sum()
            acc *= alpha[..., None]
            acc += weighted_values(p, vg[..., j0:j1, :], keep)
            m_i = m_new
        if prob.sink is not None:  # the sink's column joins the sums once, rebased
            m_new = np.maximum(m_i, prob.sink)
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dt, copy=False)
            alpha = np.exp(m_i - m_safe)
            l_i = l_i * alpha + np.exp(prob.sink - m_safe)
            acc *= alpha[..., None]
            m_i = m_new
        # l_i == 0 exactly when a row saw no allowed key (and no sink): output 0, lse -inf.
        out[..., i0:i1, :] = np.divide(
            acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] != 0
        )
        # m_i and l_i are summed in the LSE's dtype: in float64 nothing is lost.
        m_w, l_w = m_i.astype(lse.dtype), l_i.astype(lse.dtype)
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l_i != 0, m_w + np.log(l_w), -np.inf)

    starts = range(0, Tq, block_q)
    if work.threads > 1 and len(starts) > 1:
        with blas_threads_limited(work.limit_blas), ThreadPoolExecutor(work.threads) as pool:
            list(pool.map(one_query_block, starts))
    else:
        for i0 in starts:
            one_query_block(i0)

    out = ungrouped(out, G)
    out = out.astype(result_dtype(np.result_type(q.dtype, k.dtype, v.dtype)), copy=False)
    return (out, lse.reshape(out.shape[:-1])) if return_lse else out


# -- backward -----------------------------------------------------------------------------


def _split_lse(lse: np.ndarray, dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``lse`` as ``hi + lo`` in ``dt``: ``hi`` its rounding, ``lo`` the rest (0 when
    ``lse`` is no wider than ``dt``). An empty row (``-inf``) gets ``hi = +inf``, ``lo = 0``,
    so that ``exp((s - hi) - lo)`` is 0 there with no ``inf - inf``."""
    hi = lse.astype(dt)
    lo = np.zeros_like(hi)
    if np.dtype(lse.dtype).itemsize > dt.itemsize:
        fin = np.isfinite(lse)
        lo = np.where(fin, lse - np.where(fin, hi, 0), 0).astype(dt)
    return np.where(np.isneginf(hi), np.inf, hi), lo


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
    block_q: int | None = None,
    block_k: int | None = None,
) -> tuple[np.ndarray, ...]:
    """VJP of :func:`flash_attention`, block by block, from the saved ``out`` and ``lse``.

    The probabilities are recomputed tile by tile as ``P = exp(S - lse)`` (exactly the
    normalised softmax, since ``lse`` is each row's log normaliser), from the forward's
    scores bit for bit. ``S - lse`` is formed as ``(S - hi) - lo`` with ``hi + lo`` the LSE
    split into the compute dtype, so a float64 ``lse`` (``flash_attention(...,
    lse_dtype=np.float64)``) keeps float32 probabilities exact at any magnitude; a float32
    one bounds their relative error by its own rounding, ``eps * |lse|`` (5e-4 at 1e4).
    For ``O = P V``:
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
        out, lse: the forward's outputs (``lse`` best in float64, see above).
        causal, window, scale, softcap, sinks, segment_ids, block_q, block_k: as given to
            the forward.

    Returns:
        ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``, in the compute dtype; with
        ``sinks``, ``(dq, dk, dv, d_sinks (H,))``.
    """
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    prob = _problem(q, k, v, causal, window, scale, softcap, sinks, segment_ids)
    tiles = plan(q.shape[-2], k.shape[-2], block_q, block_k, 1)
    block_q, block_k = tiles.block_q, tiles.block_k
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
    hi, lo = (grouped(x[..., None], G)[..., 0] for x in _split_lse(lse, dt))
    offset = Tk - Tq
    dq = np.zeros(lead + (Tq, q.shape[-1]), dtype=dt)
    dk = np.zeros(k.shape, dtype=dt)
    dv = np.zeros(v.shape, dtype=dt)
    s_scale = dt.type(scale)
    kT = np.ascontiguousarray(np.swapaxes(kg, -1, -2))  # as in the forward
    # The dS matmuls use copies with NaN/inf zeroed (see finite_or_zero); the scores use
    # the originals, so an attended NaN still reaches dS.
    q_mm, k_mm, v_mm = finite_or_zero(qg), finite_or_zero(kg), finite_or_zero(vg)
    nan_rows = not np.all(np.isfinite(delta))

    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = _scaled_queries(qg, i0, i1, scale)
        do_i = dog[..., i0:i1, :]
        hi_i, lo_i = hi[..., i0:i1, None], lo[..., i0:i1, None]
        delta_i = delta[..., i0:i1, None]
        dq_i = np.zeros(lead + (i1 - i0, q.shape[-1]), dtype=dt)
        j_lo = 0 if left is None else max(0, i0 + offset - left)
        j_hi = Tk if right is None else min(Tk, i1 - 1 + offset + right + 1)
        for j0 in range((j_lo // block_k) * block_k, j_hi, block_k):
            j1 = min(j0 + block_k, Tk)
            skip, keep = _tile_keep(prob, i0, i1, j0, j1, offset)
            if skip:
                continue
            s = np.matmul(qi, kT[..., j0:j1])  # (..., bq, bk), the forward's scores
            tanh = None
            if prob.softcap is not None:  # as _tile_scores does it in the forward
                tanh = np.tanh(s / dt.type(prob.softcap))
                s = tanh * dt.type(prob.softcap)
            if keep is not None:
                s = np.where(keep, s, -np.inf)
            p = np.exp((s - hi_i) - lo_i)  # the forward's probabilities, recomputed
            dp = do_i @ np.swapaxes(v_mm[..., j0:j1, :], -1, -2)
            ds = p * (dp - delta_i)
            if nan_rows:  # a row attending a NaN value: its NaN delta stays on its own keys
                ds = np.where(p != 0, ds, 0.0)
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
    # exp(z - lse) per row; hi is +inf only where a row had neither key nor sink.
    sink_weight = np.exp((prob.sink - hi) - lo)
    H = len(sinks)  # type: ignore[arg-type]
    d_sinks = sinks_backward(
        ungrouped(sink_weight[..., None], G), ungrouped(delta[..., None], G), H
    )
    return dq, dk * s_scale, dv, d_sinks
