"""Additive (Bahdanau) attention, forward and backward, as plain readable NumPy.

Score ``a(q, k) = w_v . tanh(q W_q + k W_k)``; the rest (bias, masks, softmax, dropout,
values) is :func:`attnkit.numpy.attention.attend`, shared with dot-product attention.
"""

from __future__ import annotations

import numpy as np

from ..spec import Window
from .attention import (
    AttentionCache,
    _floats,
    attend,
    attend_backward,
    check_additive,
    finite_or_zero,
    sum_to_shape,
)
from .softmax import compute_dtype, result_dtype

__all__ = ["additive_attention", "additive_backward", "additive_forward"]


def additive_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray,
    w_q: np.ndarray, w_k: np.ndarray, w_v: np.ndarray,
    **options: object,
) -> tuple[np.ndarray, AttentionCache, np.ndarray]:
    """:func:`additive_attention` in the compute dtype; also returns the tanh features."""
    arrays = [_floats(n, x) for n, x in zip("q k v w_q w_k w_v".split(), (q, k, v, w_q, w_k, w_v))]
    check_additive(*arrays)
    dt = compute_dtype(np.result_type(*(x.dtype for x in arrays)))
    q, k, v, w_q, w_k, w_v = (x.astype(dt, copy=False) for x in arrays)
    # (..., Tq, 1, h) + (..., 1, Tk, h) -> (..., Tq, Tk, h)
    features = np.tanh((q @ w_q)[..., :, None, :] + (k @ w_k)[..., None, :, :])
    scores = features @ w_v  # (..., Tq, Tk)
    out, cache = attend(scores, v, **options)  # type: ignore[arg-type]
    return out, cache, features


def additive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    w_q: np.ndarray,
    w_k: np.ndarray,
    w_v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Bahdanau attention: score ``a(q, k) = w_v . tanh(q W_q + k W_k)``.

    Queries and keys may have different widths; weights use the ``x @ W`` layout (the
    transpose of ``nn.Linear.weight``).

    Args:
        q: ``(..., Tq, Dq)``.
        k: ``(..., Tk, Dk)``.
        v: ``(..., Tk, Dv)``.
        w_q: ``(Dq, h)``.
        w_k: ``(Dk, h)``.
        w_v: ``(h,)``.
        mask, bias, valid_lens, causal, window, dropout_p, rng: as in
            :func:`scaled_dot_product_attention`.

    Returns:
        ``(out (..., Tq, Dv), weights (..., Tq, Tk))``.
    """
    out, cache, _ = additive_forward(
        q, k, v, w_q, w_k, w_v, mask=mask, bias=bias, valid_lens=valid_lens,
        causal=causal, window=window, dropout_p=dropout_p, rng=rng,
    )
    dt = result_dtype(np.result_type(*(np.asarray(x).dtype for x in (q, k, v, w_q, w_k, w_v))))
    return out.astype(dt, copy=False), cache.weights.astype(dt, copy=False)


def additive_backward(
    d_out: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    w_q: np.ndarray,
    w_k: np.ndarray,
    w_v: np.ndarray,
    cache: AttentionCache,
    features: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """VJP of :func:`additive_attention` given :func:`additive_forward`'s cache and features.

    With ``a = (q W_q)[:, None] + (k W_k)[None, :]``, ``f = tanh(a)`` and
    ``scores = f . w_v``: ``d w_v = sum f * dS``, ``d a = dS w_v (1 - f^2)`` (tanh' is
    ``1 - tanh^2``); ``d(q W_q)`` sums ``d a`` over keys and ``d(k W_k)`` over queries, and
    each linear map sends ``dY`` to ``dX = dY W^T``, ``dW = X^T dY``.

    Returns:
        ``(dq, dk, dv, dw_q, dw_k, dw_v, d_scores)`` in the compute dtype, each shaped like
        its input; ``d_scores (..., Tq, Tk)`` as in :func:`sdpa_backward`.
    """
    d_scores, dv, _ = attend_backward(d_out, v, cache)
    dt = d_scores.dtype
    q, k, w_q, w_k, w_v = (np.asarray(x).astype(dt, copy=False) for x in (q, k, w_q, w_k, w_v))
    q, k = finite_or_zero(q), finite_or_zero(k)
    features = finite_or_zero(features)  # NaN features of masked pairs meet dS = 0
    hidden = w_v.shape[0]
    dw_v = d_scores.reshape(-1) @ features.reshape(-1, hidden)
    d_a = d_scores[..., None] * w_v * (1.0 - features * features)  # (..., Tq, Tk, h)
    d_qw = sum_to_shape(d_a.sum(axis=-2), q.shape[:-1] + (hidden,))  # (..., Tq, h)
    d_kw = sum_to_shape(d_a.sum(axis=-3), k.shape[:-1] + (hidden,))  # (..., Tk, h)
    dq, dk = d_qw @ w_q.T, d_kw @ w_k.T
    dw_q = q.reshape(-1, q.shape[-1]).T @ d_qw.reshape(-1, hidden)
    dw_k = k.reshape(-1, k.shape[-1]).T @ d_kw.reshape(-1, hidden)
    return dq, dk, dv, dw_q, dw_k, dw_v, d_scores
