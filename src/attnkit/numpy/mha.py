"""Multi-head attention, forward and backward, on the weights of :class:`MultiHeadParams`
(:mod:`attnkit.numpy.mha_params` draws their per-head layout).

The forward is a chain of small named steps (:func:`fit_inputs`, :func:`project_heads`,
:func:`head_scores`, ``attend``, :func:`merge_heads`, :func:`project_output`);
:func:`mha_backward` runs their VJPs in reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import (
    AttentionCache,
    attend,
    attend_backward,
    check_qkv,
    finite_or_zero,
    scaled_scores,
    scores_backward,
)
from .masks import Window
from .mha_params import MultiHeadParams, head_sizes
from .softmax import compute_dtype, result_dtype

__all__ = ["MultiHeadParams", "head_sizes", "multi_head_attention"]


@dataclass
class MultiHeadCache:
    """Intermediates of :func:`mha_forward` kept for the backward pass (compute dtype)."""

    query: np.ndarray  # (B, Tq, Eq)
    key: np.ndarray  # (B, Tk, Ek)
    value: np.ndarray  # (B, Tk, Ev)
    q: np.ndarray  # (B, H, Tq, Dk)
    k: np.ndarray  # (B, Hkv, Tk, Dk)
    v: np.ndarray  # (B, Hkv, Tk, Dv)
    heads: np.ndarray  # (B, Tq, H*Dv), concatenated head outputs
    attention: AttentionCache
    scale: float


# -- the forward, one named step at a time ------------------------------------------------
# mha_forward runs these in order; attnkit.viz.trace runs the same functions to report the
# shape between each pair, so the oracle itself carries no tracing.


def fit_inputs(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
) -> tuple[MultiHeadParams, np.ndarray, np.ndarray, np.ndarray]:
    """Check ``query (B, Tq, Eq)``, ``key (B, Tk, Ek)``, ``value (B, Tk, Ev)`` against the
    weights and return ``(params, query, key, value)``, all in the compute dtype.

    ``key=None`` means ``key = query`` (self-attention); ``value=None`` means ``value = key``.
    """
    key = query if key is None else key
    value = key if value is None else value
    arrays = [np.asarray(a) for a in (query, key, value)]
    for name, x, width in zip(
        ("query", "key", "value"), arrays, (params.embed_dim, params.kdim, params.vdim)
    ):
        if x.ndim != 3 or x.shape[-1] != width:
            raise ValueError(f"{name} must be (B, T, {width}), got {x.shape}")
    if arrays[1].shape[:2] != arrays[2].shape[:2] or arrays[0].shape[0] != arrays[1].shape[0]:
        raise ValueError(
            f"query {arrays[0].shape}, key {arrays[1].shape} and value {arrays[2].shape} must "
            f"share B, and key/value must share Tk"
        )
    dt = compute_dtype(np.result_type(*(a.dtype for a in arrays), params.w_q.dtype))
    query, key, value = (a.astype(dt, copy=False) for a in arrays)
    return params.map(lambda a: a.astype(dt, copy=False)), query, key, value


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``(B, T, E) x (H, E, D) -> (B, H, T, D)``."""
    y = np.einsum("bte,hed->bhtd", x, w)
    return y if b is None else y + b[:, None, :]


def project_heads(
    p: MultiHeadParams, query: np.ndarray, key: np.ndarray, value: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-head projections ``(q, k, v)``."""
    q = _project(query, p.w_q, p.b_q)  # (B, H, Tq, Dk)
    k = _project(key, p.w_k, p.b_k)  # (B, Hkv, Tk, Dk)
    v = _project(value, p.w_v, p.b_v)  # (B, Hkv, Tk, Dv)
    return q, k, v


def head_scores(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None
) -> tuple[np.ndarray, float, int]:
    """``(scores (B, H, Tq, Tk), scale, G)``: scaled ``q k^T`` per head, ``G = H // Hkv``."""
    G = check_qkv(q, k, v)
    scores, scale = scaled_scores(q, k, G, scale)
    return scores, scale, G


def merge_heads(out: np.ndarray) -> np.ndarray:
    """Concatenate the heads: ``(B, H, Tq, Dv) -> (B, Tq, H*Dv)``."""
    B, H, Tq, Dv = out.shape
    return out.transpose(0, 2, 1, 3).reshape(B, Tq, H * Dv)


def project_output(p: MultiHeadParams, heads: np.ndarray) -> np.ndarray:
    """``(B, Tq, H*Dv) -> (B, Tq, Eo)``: the output projection ``heads W_o + b_o``."""
    y = heads @ p.w_o
    return y if p.b_o is None else y + p.b_o


def mha_forward(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
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
) -> tuple[np.ndarray, MultiHeadCache]:
    """:func:`multi_head_attention` in the compute dtype, with the cache for backward."""
    p, query, key, value = fit_inputs(params, query, key, value)
    q, k, v = project_heads(p, query, key, value)
    scores, scale, G = head_scores(q, k, v, scale)
    out, att = attend(
        scores, v, groups=G, mask=mask, bias=bias, valid_lens=valid_lens, causal=causal,
        window=window, dropout_p=dropout_p, rng=rng, softcap=softcap, sinks=sinks,
        segment_ids=segment_ids,
    )  # (B, H, Tq, Dv)
    heads = merge_heads(out)
    return project_output(p, heads), MultiHeadCache(query, key, value, q, k, v, heads, att, scale)


def multi_head_attention(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
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
    """Multi-head attention, batch-first.

    Args:
        params: the layer's weights (:class:`MultiHeadParams`).
        query: ``(B, Tq, Eq)``.
        key: ``(B, Tk, Ek)``; None = self-attention (``key = query``).
        value: ``(B, Tk, Ev)``; None = ``key``.
        mask, bias, valid_lens, causal, window, scale, softcap, sinks, segment_ids,
            dropout_p, rng: as in :func:`scaled_dot_product_attention`, on scores
            ``(B, H, Tq, Tk)`` (``sinks (H,)``, one logit per query head; ``segment_ids``
            ``(B, T)`` for self-attention or ``(q_ids (B, Tq), kv_ids (B, Tk))``).

    Returns:
        ``(out (B, Tq, Eo), weights (B, H, Tq, Tk))``, weights pre-dropout.

    The shape of every step is printed by ``attnkit trace``
    (:func:`attnkit.viz.trace.trace_mha`), which runs the same steps.
    """
    y, cache = mha_forward(
        params, query, key, value, mask=mask, bias=bias, valid_lens=valid_lens,
        causal=causal, window=window, scale=scale, softcap=softcap, sinks=sinks,
        segment_ids=segment_ids, dropout_p=dropout_p, rng=rng,
    )
    dt = result_dtype(np.result_type(np.asarray(query).dtype, params.w_q.dtype))
    return y.astype(dt, copy=False), cache.attention.weights.astype(dt, copy=False)


# -- backward -----------------------------------------------------------------------------


def _project_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, has_bias: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """VJP of :func:`_project` (``y[b,h,t,d] = sum_e x[b,t,e] w[h,e,d] + b[h,d]``):
    ``dx = sum_hd dy w``, ``dw = sum_bt x dy``, ``db = sum_bt dy``."""
    dx = np.einsum("bhtd,hed->bte", dy, w, optimize=True)
    dw = np.einsum("bte,bhtd->hed", finite_or_zero(x), dy, optimize=True)
    return dx, dw, (dy.sum(axis=(0, 2)) if has_bias else None)


def mha_backward(
    d_y: np.ndarray, params: MultiHeadParams, cache: MultiHeadCache
) -> tuple[MultiHeadParams, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """VJP of :func:`mha_forward` given its cache.

    The forward is four linear maps around an attention; the backward runs them in reverse:
    ``y = heads W_o + b_o`` gives ``d heads = dy W_o^T``, ``dW_o = heads^T dy``,
    ``db_o = sum dy``; the heads are split back to ``(B, H, Tq, Dv)``; the attention
    backward (:func:`~attnkit.numpy.attention.attend_backward`,
    :func:`~attnkit.numpy.attention.scores_backward`) gives ``dq, dk, dv`` (GQA sums over
    groups); each per-head projection then sends its gradient to its input and weights.

    Args:
        d_y: cotangent of the output, ``(B, Tq, Eo)``.
        params: the parameters the forward used.
        cache: the forward's :class:`MultiHeadCache`.

    Returns:
        ``(d_params, d_query, d_key, d_value, d_scores, d_sinks)`` in the compute dtype.
        ``d_key``/``d_value`` are the gradients of the key/value arrays the forward *used*:
        when the caller passed ``key=None`` (self-attention) they belong to ``query``, and
        the caller adds them up (:func:`attnkit.numpy.vjp` does). ``d_scores
        (B, H, Tq, Tk)`` is the gradient of an additive ``bias`` before it is summed to the
        bias's shape; ``d_sinks (H,)`` the sinks' gradient (None without sinks).
    """
    dt = cache.q.dtype
    p = params.map(lambda a: a.astype(dt, copy=False))
    d_y = np.asarray(d_y).astype(dt, copy=False)
    B, Tq, _ = d_y.shape
    H, Dv = p.num_heads, p.v_head_dim

    d_heads = d_y @ p.w_o.T  # (B, Tq, H*Dv)
    d_w_o = cache.heads.reshape(-1, H * Dv).T @ d_y.reshape(-1, d_y.shape[-1])
    d_b_o = d_y.sum(axis=(0, 1)) if p.b_o is not None else None
    d_out = d_heads.reshape(B, Tq, H, Dv).transpose(0, 2, 1, 3)  # (B, H, Tq, Dv)

    att = cache.attention
    d_scores, d_v, d_sinks = attend_backward(d_out, cache.v, att)
    d_q, d_k = scores_backward(d_scores, cache.q, cache.k, cache.scale, att.groups, att.tanh)

    d_query, d_w_q, d_b_q = _project_backward(d_q, cache.query, p.w_q, p.b_q is not None)
    d_key, d_w_k, d_b_k = _project_backward(d_k, cache.key, p.w_k, p.b_k is not None)
    d_value, d_w_v, d_b_v = _project_backward(d_v, cache.value, p.w_v, p.b_v is not None)
    d_params = MultiHeadParams(
        w_q=d_w_q, w_k=d_w_k, w_v=d_w_v, w_o=d_w_o, b_q=d_b_q, b_k=d_b_k, b_v=d_b_v, b_o=d_b_o
    )
    return d_params, d_query, d_key, d_value, d_scores, d_sinks
