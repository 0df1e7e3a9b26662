"""Blockwise attention with an online softmax (the FlashAttention algorithm), in NumPy.

Read :func:`_attend_block` first: it is the whole algorithm for one block of queries (a
running max ``m``, sum ``l`` and weighted sum ``acc`` per row, rebased by
``exp(m - m_new)`` when a key tile raises the max; ``out = acc / l``, ``lse = m +
log(l)``). Only a ``block_q x block_k`` tile of scores exists at a time, so memory is
linear in T. Which tiles a block visits (causal/window bands and segments skip whole
tiles) and how blocks share the threads is :mod:`attnkit.numpy._plan`'s business.

Precision at large logits: the scores stay in natural units and ``score - m`` is formed
before anything is rounded at their magnitude (a score of 1e4 has a float32 spacing of
1e-3, which would become a 1e-3 relative error in every probability). The backward
recomputes ``P`` from the row's LSE, so it needs the LSE to that precision too: ask for it
in float64 (``lse_dtype``; :func:`attnkit.numpy.vjp` does). Partial results over disjoint
key sets combine exactly through their LSEs (:func:`merge_partials`, ring attention).
"""

from __future__ import annotations

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
from ._plan import key_tiles, plan, run_blocks
from .attention import _floats
from .groups import fold_grouped, grouped, kv_grouped, sum_to_shape, ungrouped
from .masks import segment_mask
from .merge import merge_partials
from .nonfinite import finite_or_zero, weighted_values
from .softmax import compute_dtype, result_dtype
from .variants import sinks_backward

__all__ = ["flash_attention", "merge_partials"]


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

    def tiles(self, i0: int, i1: int, block_k: int):
        """The key tiles ``(j0, j1, keep)`` that queries ``[i0, i1)`` visit
        (:func:`attnkit.numpy._plan.key_tiles`)."""
        Tq, Tk = self.qg.shape[-2], self.kg.shape[-2]
        return key_tiles(i0, i1, Tq, Tk, block_k, self.left, self.right, self.same_segment)


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


def _scaled_queries(qg: np.ndarray, i0: int, i1: int, scale: float) -> np.ndarray:
    """Query rows ``[i0, i1)`` times the scale: the one way the forward and the backward
    form the scores (``_scaled_queries(...) @ k^T``), so that the backward's recomputed
    scores are the forward's bit for bit, and so its probabilities match the saved LSE."""
    return qg[..., i0:i1, :] * qg.dtype.type(scale)


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


# A tile's row sums against a reference that is not its own max may reach this before the
# tile is redone with its max: bounds how far exp(score - reference) may grow.
LAZY_SUM_LIMIT = 2.0**16


def _exp_tile(scores, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``p = exp(S - m_new)`` of one tile (in the tile's own buffer), its row sums, and the
    reference ``m_new`` it was taken against.

    The reference is the running max ``max(m, rowmax(S))``, except for one shortcut: once
    every row has a reference (a score already summed, so its sum is at least 1), the old
    ``m`` is kept while no row's ``sum(exp(S - m))`` passes :data:`LAZY_SUM_LIMIT`. Any
    reference gives the same ``acc / l`` and ``m + log(l)`` as long as nothing overflows,
    and keeping it saves the pass that takes the row max (9% of the forward at T=4096,
    float32, one thread). ``S - m`` is
    formed from two scores either way, so large logits lose nothing. A tile that breaks the
    limit (or holds NaN) is computed again against its max.

    Args:
        scores: ``() -> S``, forms the tile's scores ``(..., bq, bk)`` in its buffer.
        m: the running reference per row ``(..., bq)``; ``-inf`` = no allowed key yet.
    """
    s = scores()
    if np.isfinite(m).all():
        np.subtract(s, m[..., None], out=s)
        with np.errstate(over="ignore"):  # an overflow fails the test below
            p = np.exp(s, out=s)
            p_sum = p @ np.ones(p.shape[-1], p.dtype)  # a BLAS matvec reads p ~3x faster than sum()
        if np.all(p_sum <= LAZY_SUM_LIMIT):
            return p, p_sum, m
        s = scores()
    m_new = np.maximum(m, s.max(axis=-1))
    # A row with nothing allowed yet keeps m = -inf; take its exp against 0 instead.
    s -= np.where(np.isneginf(m_new), 0.0, m_new)[..., None].astype(s.dtype, copy=False)
    p = np.exp(s, out=s)
    return p, p @ np.ones(p.shape[-1], p.dtype), m_new


def _rebase(m: np.ndarray, m_new: np.ndarray) -> np.ndarray:
    """``alpha = exp(m - m_new)``: multiplies sums kept against ``m`` to sums against
    ``m_new`` (0 for a row that had no allowed key yet; 1 where the reference stayed)."""
    return np.exp(m - np.where(np.isneginf(m_new), 0.0, m_new).astype(m.dtype, copy=False))


def _attend_block(
    prob: _Problem, i0: int, i1: int, block_k: int, kT: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention's inner loop: queries ``[i0, i1)`` against every key tile they may
    see, keeping only a ``(i1 - i0) x block_k`` tile of scores at a time.

    Per query row it keeps ``m`` (the reference: the running max of the scores seen),
    ``l = sum exp(s - m)`` and ``acc = sum exp(s - m) v``. When a tile moves ``m`` to
    ``m_new``, the old sums are multiplied by ``exp(m - m_new)``; at the end
    ``out = acc / l`` and ``lse = m + log(l)``.

    Returns:
        ``(acc, l, m)`` of the block's rows: ``(..., bq, Dv)``, ``(..., bq)``, ``(..., bq)``.
    """
    dt, Dv = prob.dt, prob.vg.shape[-1]
    # Natural units throughout: scores folded into base 2 (log2(e) in the scale) would be
    # rounded at their magnitude before the max is taken off, 1e-3 at 1e4 in float32.
    qi = _scaled_queries(prob.qg, i0, i1, prob.scale)
    rows = prob.lead + (i1 - i0,)
    m = np.full(rows, -np.inf, dtype=dt)  # the running max (-inf: nothing allowed yet)
    l = np.zeros(rows, dtype=dt)  # sum of exp(score - m)  # noqa: E741
    acc = np.zeros(rows + (Dv,), dtype=dt)  # sum of exp(score - m) * v
    buffer = np.empty(rows + (block_k,), dtype=dt)  # the tile's scores, then its exp

    for j0, j1, keep in prob.tiles(i0, i1, block_k):
        def scores(j0=j0, j1=j1, keep=keep):  # S of this tile, in the buffer (again if redone)
            return _tile_scores(qi, kT[..., j0:j1], buffer[..., : j1 - j0], keep, prob.softcap)

        p, p_sum, m_new = _exp_tile(scores, m)  # p = exp(S - m_new)
        if m_new is not m:  # the reference moved: rebase the sums kept so far
            alpha = _rebase(m, m_new)
            l *= alpha
            acc *= alpha[..., None]
        l += p_sum
        acc += weighted_values(p, prob.vg[..., j0:j1, :], keep)  # p @ v
        m = m_new

    if prob.sink is not None:  # the sink: one more column with a score and no value
        m_new = np.maximum(m, prob.sink)
        alpha = _rebase(m, m_new)
        l = l * alpha + np.exp(prob.sink - m_new)  # noqa: E741
        acc *= alpha[..., None]
        m = m_new
    return acc, l, m


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
            scores. None (the default): 256 x 512 for long sequences, 128 x 256 otherwise,
            clipped to the lengths (measured in :mod:`attnkit.numpy._plan`).
        num_threads: query blocks run on this many threads (NumPy releases the GIL in
            BLAS and ufuncs), BLAS at one thread per worker meanwhile (threadpoolctl).
            None (the default): one per usable core, at most one per query block; one
            without threadpoolctl.
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
    Tq, Dv, dt = q.shape[-2], v.shape[-1], prob.dt
    out = np.zeros(prob.lead + (Tq, Dv), dtype=dt)
    lse = np.full(prob.lead + (Tq,), -np.inf, dtype=np.result_type(dt, lse_dtype or dt))
    # K^T as a transposed view, not a contiguous copy: BLAS then takes the same kernel as
    # plain q @ k^T, whose rounding the precision rule measures against (with the copy,
    # this OpenBLAS rounds scores at logits 1e5 3x worse; the view costs ~5% of the
    # score matmul).
    kT = np.swapaxes(prob.kg, -1, -2)  # (..., Hkv, 1, Dk, Tk)

    def one_query_block(i0: int) -> None:
        i1 = min(i0 + work.block_q, Tq)
        acc, l, m = _attend_block(prob, i0, i1, work.block_k, kT)  # noqa: E741
        # l == 0 exactly when a row saw no allowed key (and no sink): output 0, lse -inf.
        has_keys = l != 0
        out[..., i0:i1, :] = np.divide(acc, l[..., None], out=np.zeros_like(acc),
                                       where=has_keys[..., None])
        # m and l are summed in the LSE's dtype: in float64 nothing is lost.
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(
                has_keys, m.astype(lse.dtype) + np.log(l.astype(lse.dtype)), -np.inf)

    run_blocks(work, one_query_block, range(0, Tq, work.block_q))
    out = ungrouped(out, prob.G)
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


def _probabilities(
    prob: _Problem, qi: np.ndarray, kT: np.ndarray, keep: np.ndarray | None,
    hi: np.ndarray, lo: np.ndarray,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The forward's ``P = exp(S - lse)`` of one tile, recomputed from its scores (bit for
    bit the forward's), and ``tanh(s / softcap)`` when soft-capped (its derivative is
    needed), else None."""
    s = np.matmul(qi, kT)  # (..., bq, bk)
    tanh = None
    if prob.softcap is not None:  # as _tile_scores does it in the forward
        tanh = np.tanh(s / prob.dt.type(prob.softcap))
        s = tanh * prob.dt.type(prob.softcap)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    return np.exp((s - hi) - lo), tanh


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
    For ``O = P V``: ``dV = P^T dO`` and ``dP = dO V^T``; the softmax backward
    ``dS = P * (dP - D)`` needs one number per row, ``D_i = rowsum(P * dP)``; then
    ``dQ = scale dS K`` and ``dK = scale dS^T Q``.

    ``D_i`` equals ``rowsum(dO * O)`` in exact arithmetic, which costs nothing, but not in
    float32 at large logits: a row whose softmax is one key (``P = 1`` there) needs
    ``D_i`` to equal that key's ``dP`` to the last bit, or ``dS`` there is their rounding
    difference, multiplied into ``dQ`` by keys of size ~1e4 (measured: dK off by 1e-2
    where plain float32 math is exact). So ``D_i`` is summed from the very ``P`` and ``dP``
    tiles the gradients use, in a first sweep over the row's key tiles; this costs two
    matmuls of the five per tile again.

    Only ``block_q x block_k`` tiles exist, so memory is linear in T; key blocks outside the
    causal/window band are skipped as in the forward. A row with ``lse = -inf`` (no allowed
    key) has ``P = 0`` and gets zero gradients. Softcap multiplies ``dS`` by
    ``1 - tanh^2`` (recomputed per tile); with sinks ``lse`` includes the sink, so ``P`` is
    already the sink-normalised weight, ``dS`` keeps its form and the sink of head ``h``
    gets ``-sum exp(z_h - lse) D_i`` (:func:`attnkit.numpy.variants.sinks_backward`).

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
    G, dt, lead = prob.G, prob.dt, prob.lead
    Tq = q.shape[-2]
    heads = lead if G == 1 else lead[:-2] + (lead[-2] * G,)
    out_shape = heads + (Tq, v.shape[-1])
    d_out, out, lse = np.asarray(d_out), np.asarray(out), np.asarray(lse)
    if d_out.shape != out_shape or out.shape != out_shape or lse.shape != out_shape[:-1]:
        raise ValueError(
            f"expected d_out and out {out_shape} and lse {out_shape[:-1]}, got d_out "
            f"{d_out.shape}, out {out.shape}, lse {lse.shape}"
        )
    dog = grouped(d_out.astype(dt, copy=False), G)  # (..., Hkv, G, Tq, Dv)
    # rowsum(dO * O): D in exact arithmetic; here it only carries NaN/inf of rows that
    # attended a non-finite value (the matmuls below use copies with those zeroed).
    do_o = np.sum(dog * grouped(out.astype(dt, copy=False), G), axis=-1)  # (..., Hkv, G, Tq)
    delta = np.zeros_like(do_o)
    hi, lo = (grouped(x[..., None], G)[..., 0] for x in _split_lse(lse, dt))
    dq = np.zeros(lead + (Tq, q.shape[-1]), dtype=dt)
    dk = np.zeros(k.shape, dtype=dt)
    dv = np.zeros(v.shape, dtype=dt)
    kT = np.swapaxes(prob.kg, -1, -2)  # as in the forward
    # The dS matmuls use copies with NaN/inf zeroed (see finite_or_zero); the scores use
    # the originals, so an attended NaN still reaches dS.
    q_mm, k_mm, v_mm = finite_or_zero(prob.qg), finite_or_zero(prob.kg), finite_or_zero(prob.vg)
    vT_mm = np.swapaxes(v_mm, -1, -2)

    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = _scaled_queries(prob.qg, i0, i1, prob.scale)
        do_i = dog[..., i0:i1, :]
        hi_i, lo_i = hi[..., i0:i1, None], lo[..., i0:i1, None]
        row_tiles = list(prob.tiles(i0, i1, block_k))
        # First sweep: D_i = rowsum(P * dP), from the tiles the gradients will use.
        d_i = np.zeros(lead + (i1 - i0,), dtype=dt)
        for j0, j1, keep in row_tiles:
            p, _ = _probabilities(prob, qi, kT[..., j0:j1], keep, hi_i, lo_i)
            d_i += np.sum(p * (do_i @ vT_mm[..., j0:j1]), axis=-1)
        d_i = np.where(np.isfinite(do_o[..., i0:i1]), d_i, do_o[..., i0:i1])
        delta[..., i0:i1] = d_i
        nan_rows = not np.all(np.isfinite(d_i))
        # Second sweep: the gradients.
        dq_i = np.zeros(lead + (i1 - i0, q.shape[-1]), dtype=dt)
        for j0, j1, keep in row_tiles:
            p, tanh = _probabilities(prob, qi, kT[..., j0:j1], keep, hi_i, lo_i)
            dp = do_i @ vT_mm[..., j0:j1]
            ds = p * (dp - d_i[..., None])
            if nan_rows and keep is not None:  # a row that attended a NaN/inf: its masked
                p = np.where(keep, p, 0.0)  # keys stay selected away, never 0 * nan (from
                ds = np.where(keep, ds, 0.0)  # exp(-inf - nan lse) or 0 * (dP - nan D))
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
    s_scale = dt.type(prob.scale)
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
