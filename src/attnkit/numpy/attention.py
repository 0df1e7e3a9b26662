"""Scaled dot-product attention, as plain readable NumPy, and the tail every attention
shares (:func:`attend`: softcap, bias, masks, softmax with sinks, dropout, values; additive
attention in :mod:`attnkit.numpy.additive` ends with it too).

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

Both ops return ``(out, weights)``: ``out`` is ``(..., Tq, Dv)`` and ``weights`` the
pre-dropout attention probabilities ``(..., Tq, Tk)``. Computation happens in float64 for
float64 input, float32 for float32 and float16 input; results come back in the input dtype.

Grouped-query attention (GQA) is read off the head axis ``-3``: when q has ``H`` heads and
k/v have ``Hkv`` heads with ``H % Hkv == 0``, query head ``h`` uses key/value head
``h // G``. K and V are never copied ``G`` times (:mod:`attnkit.numpy.groups`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec import Window, check_broadcast, check_dropout, check_qkv, check_softcap, default_scale
from .groups import group_sum_matmul, grouped_matmul, sum_to_shape
from .masks import attention_mask
from .nonfinite import finite_or_zero, weighted_values
from .softmax import compute_dtype, result_dtype, softmax
from .variants import sink_column, sink_softmax, sinks_backward, softcap_backward, softcap_scores

__all__ = ["scaled_dot_product_attention"]


@dataclass
class AttentionCache:
    """What a forward pass keeps for its backward (all in the compute dtype).

    Attributes:
        weights: softmax probabilities ``(..., H, Tq, Tk)`` before dropout.
        keep: the ANDed bool mask (broadcastable to ``weights``) or None.
        dropout_keep: the dropout keep-mask, or None without dropout.
        dropout_p: the dropout probability.
        groups: ``G = H // Hkv`` (1 without GQA).
        tanh: ``tanh(s / softcap)`` of the scores, or None without softcap.
        sink_weight: ``exp(z - L)`` per row ``(..., H, Tq, 1)``, or None without sinks.
    """

    weights: np.ndarray
    keep: np.ndarray | None
    dropout_keep: np.ndarray | None
    dropout_p: float
    groups: int
    tanh: np.ndarray | None = None
    sink_weight: np.ndarray | None = None


def _floats(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise TypeError(f"{name} must be a real array, got dtype {x.dtype}")
    return x


def attend(
    scores: np.ndarray,
    v: np.ndarray,
    *,
    groups: int = 1,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    segment_ids: object = None,
) -> tuple[np.ndarray, AttentionCache]:
    """Shared tail of every attention: softcap, bias, masks, softmax (with sinks), dropout,
    weighted sum of v.

    Args:
        scores: ``(..., H, Tq, Tk)`` scaled scores, compute dtype.
        v: ``(..., Hkv, Tk, Dv)``, compute dtype.

    Returns:
        ``(out (..., H, Tq, Dv), cache)``.
    """
    scores, tanh = softcap_scores(scores, check_softcap(softcap))
    if bias is not None:
        b = _floats("bias", bias)
        check_broadcast("bias", b.shape, scores.shape)
        scores = scores + b.astype(scores.dtype, copy=False)
    keep = attention_mask(
        scores.shape, mask=mask, valid_lens=valid_lens, causal=causal, window=window,
        segment_ids=segment_ids,
    )
    if keep is not None:
        # -inf, not a large negative constant: the softmax guards rows left empty.
        scores = np.where(keep, scores, -np.inf)
    sink_weight = None
    if sinks is None:
        weights = softmax(scores, axis=-1)
    else:
        sink = sink_column(sinks, scores.shape, scores.dtype)
        weights, sink_weight, _ = sink_softmax(scores, sink)

    dropped, dropout_keep = weights, None
    dropout_p = check_dropout(dropout_p)
    if dropout_p > 0.0:
        rng = np.random.default_rng() if rng is None else rng
        dropout_keep = rng.random(weights.shape) >= dropout_p
        dropped = np.where(dropout_keep, weights / (1.0 - dropout_p), 0.0)

    out = weighted_values(dropped, v, keep, lambda a, b: grouped_matmul(a, b, groups))
    cache = AttentionCache(weights, keep, dropout_keep, dropout_p, groups, tanh, sink_weight)
    return out, cache


def scaled_scores(
    q: np.ndarray, k: np.ndarray, groups: int, scale: float | None
) -> tuple[np.ndarray, float]:
    """``q k^T * scale``, the scores of every dot-product attention.

    Args:
        q: ``(..., H, Tq, Dk)``, compute dtype.
        k: ``(..., Hkv, Tk, Dk)``, same dtype; ``groups = H // Hkv``.
        scale: None = ``1/sqrt(Dk)``.

    Returns:
        ``(scores (..., H, Tq, Tk), scale)``, the scale as a float.
    """
    scale = default_scale(scale, q.shape[-1])
    qk = grouped_matmul(q, np.swapaxes(k, -1, -2), groups)  # (..., H, Tq, Tk)
    return qk * q.dtype.type(scale), scale


def sdpa_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    segment_ids: object = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, AttentionCache, float]:
    """:func:`scaled_dot_product_attention` in the compute dtype, with its cache and scale."""
    q, k, v = _floats("q", q), _floats("k", k), _floats("v", v)
    G = check_qkv(q, k, v)
    dt = compute_dtype(np.result_type(q.dtype, k.dtype, v.dtype))
    qc, kc, vc = (x.astype(dt, copy=False) for x in (q, k, v))
    scores, scale = scaled_scores(qc, kc, G, scale)
    out, cache = attend(
        scores, vc, groups=G, mask=mask, bias=bias, valid_lens=valid_lens,
        causal=causal, window=window, dropout_p=dropout_p, rng=rng, softcap=softcap,
        sinks=sinks, segment_ids=segment_ids,
    )
    return out, cache, scale


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    segment_ids: object = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(softcap(q k^T * scale) + bias, masked) v``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)``).
        k: ``(..., Hkv, Tk, Dk)``; ``Hkv`` divides ``H`` (GQA/MQA).
        v: ``(..., Hkv, Tk, Dv)``; ``Dv`` may differ from ``Dk``.
        mask: bool, True = may attend, broadcastable to ``(..., H, Tq, Tk)``.
        bias: float, broadcastable, added to the scaled scores (``-inf`` excludes).
        valid_lens: ``(B,)`` or ``(B, Tq)``: keys ``j < valid_len`` are valid.
        causal: True or ``"bottom_right"`` (query ``i`` sees keys ``j <= i + Tk - Tq``),
            or ``"top_left"`` (``j <= i``, SDPA's and JAX's ``is_causal``).
        window: ``(left, right)`` sliding window around the bottom-right diagonal (also
            with ``causal="top_left"``); None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: scores become ``softcap * tanh(s / softcap)`` after the scale, before the
            bias; None = off.
        sinks: ``(H,)`` float, one logit per query head: a value-less column in each
            softmax denominator (:mod:`attnkit.numpy.variants`).
        segment_ids: integer ``(B, T)`` (self-attention) or a pair ``(q_ids (B, Tq),
            kv_ids (B, Tk))``: query ``i`` attends key ``j`` only if their ids are equal;
            an id < 0 is padding (output 0, zero gradients).
        dropout_p: probability of zeroing a weight (survivors scaled by ``1/(1-p)``).
        rng: generator for the dropout mask.

    Returns:
        ``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk))``; weights are pre-dropout
        (with sinks they sum to less than 1). A query with no allowed key gets weights 0
        and output 0.

    Reference, without masks::

        w = softmax(q @ k.swapaxes(-1, -2) * scale)
        out = w @ v
    """
    out, cache, _ = sdpa_forward(
        q, k, v, mask=mask, bias=bias, valid_lens=valid_lens, causal=causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, segment_ids=segment_ids,
        dropout_p=dropout_p, rng=rng,
    )
    dt = result_dtype(np.result_type(*(np.asarray(x).dtype for x in (q, k, v))))
    return out.astype(dt, copy=False), cache.weights.astype(dt, copy=False)


def check_additive(
    q: np.ndarray, k: np.ndarray, v: np.ndarray,
    w_q: np.ndarray, w_k: np.ndarray, w_v: np.ndarray,
) -> None:
    """Validate additive-attention shapes (see :func:`additive_attention`).

    Reads only ``.ndim`` and ``.shape``, so :mod:`attnkit.torch` runs it on tensors too.
    """
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    wqs, wks, wvs = tuple(w_q.shape), tuple(w_k.shape), tuple(w_v.shape)
    if q.ndim < 2 or q.ndim != k.ndim or k.ndim != v.ndim:
        raise ValueError(
            f"q, k, v must share their number of dims (>= 2), got q {qs}, k {ks}, v {vs}"
        )
    if ks[:-1] != vs[:-1]:
        raise ValueError(f"k and v must agree on every axis but the last: k {ks}, v {vs}")
    if w_q.ndim != 2 or w_k.ndim != 2 or w_v.ndim != 1:
        raise ValueError(f"expected w_q (Dq, h), w_k (Dk, h), w_v (h,), got {wqs}, {wks}, {wvs}")
    if wqs[0] != qs[-1] or wks[0] != ks[-1]:
        raise ValueError(
            f"w_q {wqs} must take q's width {qs[-1]} and w_k {wks} k's width {ks[-1]}"
        )
    if not (wqs[1] == wks[1] == wvs[0]):
        raise ValueError(f"hidden sizes differ: w_q {wqs}, w_k {wks}, w_v {wvs}")
    try:
        np.broadcast_shapes(qs[:-2], ks[:-2])
    except ValueError:
        raise ValueError(f"batch dims of q {qs} and k {ks} do not broadcast") from None


# -- backward -----------------------------------------------------------------------------
#
# The forward is   scores = scale * q k^T (+ bias)  ->  w = softmax(masked scores)
#                  ->  w' = dropout(w)  ->  out = w' v.
# Its backward runs the same chain in reverse. GQA: query head h reads key/value head
# h // G, so the gradient of a shared K/V head is the sum over its G query heads. That sum
# is taken inside one matmul by stacking the G heads of a group along the time axis
# (:func:`attnkit.numpy.groups.group_sum_matmul`), so K and V are never repeated G times,
# and nor are their gradients.


def attend_backward(
    d_out: np.ndarray, v: np.ndarray, cache: AttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """VJP of :func:`attend`: from ``d_out (..., H, Tq, Dv)`` to ``(d_scores, d_v,
    d_sinks)``.

    ``out = w' v`` gives ``d_w' = d_out v^T`` and ``d_v = w'^T d_out`` (summed over each
    GQA group and over batch dims v was broadcast along). Dropout ``w' = w * keep / (1-p)``
    is linear with the forward's own mask, so ``d_w = d_w' * keep / (1-p)``. Softmax:
    ``d_scores = w * (d_w - rowsum(d_w * w))``. Masked entries have ``w = 0``, so they, and
    every entry of a fully masked row, get gradient 0. ``d_scores`` is also the gradient of
    an additive ``bias`` (before :func:`sum_to_shape` to the bias's shape). Sinks leave
    that formula as it is and get their own gradient; softcap comes before the bias, so
    its factor is applied by :func:`scores_backward`.

    Args:
        d_out: cotangent of the attention output.
        v: the values ``(..., Hkv, Tk, Dv)`` the forward used (compute dtype).
        cache: the forward's :class:`AttentionCache`.

    Returns:
        ``(d_scores (..., H, Tq, Tk), d_v shaped like v, d_sinks (H,) or None)``, in the
        compute dtype.
    """
    G, w = cache.groups, cache.weights
    d_out = np.asarray(d_out).astype(w.dtype, copy=False)
    v = np.asarray(v).astype(w.dtype, copy=False)
    dropped = w
    if cache.dropout_keep is not None:
        rescale = np.where(cache.dropout_keep, 1.0 / (1.0 - cache.dropout_p), 0.0).astype(
            w.dtype
        )
        dropped = w * rescale
    d_v = sum_to_shape(group_sum_matmul(dropped, d_out, G), v.shape)
    d_w = grouped_matmul(d_out, np.swapaxes(v, -1, -2), G)  # (..., H, Tq, Tk)
    if cache.dropout_keep is not None:
        d_w = d_w * rescale
    if cache.keep is not None:
        # NaN/inf in a masked value row reaches d_w through v^T; 0 * nan would leak it.
        d_w = np.where(cache.keep, d_w, 0.0)
    row_term = np.sum(d_w * w, axis=-1, keepdims=True)  # (..., H, Tq, 1)
    d_scores = w * (d_w - row_term)
    if cache.keep is not None and not np.isfinite(row_term).all():
        # A row that attended a NaN/inf has a non-finite row term: its masked entries are
        # selected away (gradient 0), not 0 * nan, or every key would get a NaN dK.
        d_scores = np.where(cache.keep, d_scores, 0.0)
    d_sinks = None
    if cache.sink_weight is not None:
        H = w.shape[-3] if w.ndim >= 3 else 1
        d_sinks = sinks_backward(cache.sink_weight, row_term, H)
    return d_scores, d_v, d_sinks


def scores_backward(
    d_scores: np.ndarray, q: np.ndarray, k: np.ndarray, scale: float, G: int,
    tanh: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """VJP of ``scores = softcap(scale * q k^T)`` (GQA-aware): through the cap
    (``tanh``, None without softcap), then ``dq = scale dS k``, ``dk = scale dS^T q``
    (summed over each group). Returns ``(dq, dk)`` shaped like q, k."""
    d_scores = softcap_backward(d_scores, tanh)
    dt = d_scores.dtype
    q, k = finite_or_zero(q.astype(dt, copy=False)), finite_or_zero(k.astype(dt, copy=False))
    dq = grouped_matmul(d_scores, k, G) * dt.type(scale)  # (..., H, Tq, Dk)
    dk = group_sum_matmul(d_scores, q, G) * dt.type(scale)
    return sum_to_shape(dq, q.shape), sum_to_shape(dk, k.shape)


def sdpa_backward(
    d_out: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cache: AttentionCache,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """VJP of :func:`scaled_dot_product_attention` given :func:`sdpa_forward`'s cache.

    Args:
        d_out: cotangent of ``out``, ``(..., H, Tq, Dv)``.
        q, k, v: the forward's inputs.
        cache, scale: what :func:`sdpa_forward` returned.

    Returns:
        ``(dq, dk, dv, d_scores, d_sinks)`` in the compute dtype; ``dq``/``dk``/``dv`` are
        shaped like ``q``/``k``/``v``, ``d_scores (..., H, Tq, Tk)`` is the gradient of the
        bias before ``sum_to_shape(d_scores, bias.shape)``, ``d_sinks (H,)`` (None without
        sinks).
    """
    d_scores, dv, d_sinks = attend_backward(d_out, v, cache)
    dq, dk = scores_backward(
        d_scores, np.asarray(q), np.asarray(k), scale, cache.groups, cache.tanh
    )
    return dq, dk, dv, d_scores, d_sinks
