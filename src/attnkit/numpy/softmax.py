"""Numerically safe softmax, log-softmax and log-sum-exp.

The max trick: ``softmax(x) == softmax(x - c)`` for any constant ``c``, so we subtract the
row maximum before ``exp`` and nothing overflows, whatever the magnitude of the logits.
A row whose maximum is ``-inf`` (every entry excluded) would give ``-inf - (-inf) = nan``;
such rows are guarded explicitly and give zeros (softmax) and ``-inf`` (log-sum-exp).

Half-precision inputs are computed in float32 and returned in their own dtype. No function
here writes into its input.
"""

from __future__ import annotations

import numpy as np

from ..spec import stats_dtype_name

__all__ = ["compute_dtype", "log_softmax", "logsumexp", "softmax"]


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float16 -> float32, float32/64 kept, ints -> float64.

    For float16/32/64 this is :func:`attnkit.spec.stats_dtype_name`, the statistics dtype
    every backend uses. NumPy also takes what the shared rule does not name: integers and
    bools (read as float64, NumPy's own promotion) and ``longdouble`` (kept, it is wider).
    """
    dtype = np.dtype(dtype)
    if dtype in (np.float16, np.float32, np.float64):
        return np.dtype(stats_dtype_name(dtype))
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        return np.dtype(np.float64)
    if np.issubdtype(dtype, np.floating):  # longdouble and friends
        return dtype
    raise TypeError(f"expected a real floating or integer array, got dtype {dtype}")


def result_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype results come back in: the input's own float dtype, float64 for integers."""
    dtype = np.dtype(dtype)
    return dtype if np.issubdtype(dtype, np.floating) else compute_dtype(dtype)


def _shifted(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x - m, m)`` with ``m`` the row max, where a row max of +-inf is replaced by 0.

    Replacing a non-finite max by 0 keeps ``exp(x - m)`` free of ``inf - inf`` and
    ``-inf - (-inf)``: an all ``-inf`` row gives ``exp(-inf) = 0`` everywhere. NaN still
    propagates, because ``exp(nan) = nan``.
    """
    # initial=-inf: an empty axis reduces like an all -inf row (log-sum-exp of nothing).
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)
    return x - m, m


def logsumexp(x: np.ndarray, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """``log(sum(exp(x), axis))`` without overflow; ``-inf`` for an all ``-inf`` row.

    Args:
        x: array of any shape and real dtype.
        axis: the axis to reduce.
        keepdims: keep the reduced axis with size 1.

    Returns:
        The reduced array, in ``x``'s float dtype (float64 for integer input); half
        precision is computed in float32.
    """
    x = np.asarray(x)
    xc = x.astype(compute_dtype(x.dtype), copy=False)
    z, m = _shifted(xc, axis)
    s = np.sum(np.exp(z), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer for empty rows
        out = np.log(s) + m
    if not keepdims:
        out = np.squeeze(out, axis=axis)
    return out.astype(result_dtype(x.dtype), copy=False)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable softmax along ``axis``; a row of all ``-inf`` gives all zeros.

    Args:
        x: array of any shape and real dtype (float16/32/64; ints are read as float64).
        axis: the axis that sums to one.

    Returns:
        An array of ``x``'s shape and float dtype.
    """
    x = np.asarray(x)
    xc = x.astype(compute_dtype(x.dtype), copy=False)
    z, _ = _shifted(xc, axis)
    e = np.exp(z)
    s = np.sum(e, axis=axis, keepdims=True)
    # s == 0 only for rows with no allowed entry; `!= 0` (not `> 0`) lets NaN through.
    out = np.divide(e, s, out=np.zeros_like(e), where=s != 0)
    if np.isnan(s).any():  # a NaN row: its -inf (excluded) entries stay 0, not 0 / nan
        out = np.where(np.isneginf(xc), 0.0, out)
    return out.astype(result_dtype(x.dtype), copy=False)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``x - logsumexp(x)`` along ``axis``; an all ``-inf`` row stays all ``-inf`` (log 0).

    Args:
        x: array of any shape and real dtype.
        axis: the normalised axis.

    Returns:
        An array of ``x``'s shape and float dtype.
    """
    x = np.asarray(x)
    xc = x.astype(compute_dtype(x.dtype), copy=False)
    lse = logsumexp(xc, axis=axis, keepdims=True)
    lse = np.where(np.isneginf(lse), 0.0, lse)  # empty row: -inf - 0 = -inf, not nan
    return (xc - lse).astype(result_dtype(x.dtype), copy=False)


# -- backward (vector-Jacobian products) -------------------------------------------------
#
# Each function takes the forward's *output* and the cotangent of that output, and returns
# the cotangent of the input, in the compute dtype. Nothing is recomputed from the input.


def softmax_backward(y: np.ndarray, dy: np.ndarray, axis: int = -1) -> np.ndarray:
    """VJP of :func:`softmax`: ``dx = y * (dy - sum(dy * y))`` along ``axis``.

    Derivation: ``dy_i/dx_j = y_i (delta_ij - y_j)``, so
    ``dx_j = sum_i dy_i y_i (delta_ij - y_j) = y_j (dy_j - sum_i dy_i y_i)``.
    An excluded entry (``y = 0``) gets 0, and an empty row (all ``y = 0``) gets all zeros.

    Args:
        y: the softmax output.
        dy: the cotangent of ``y``, same shape.
        axis: the normalised axis.

    Returns:
        ``dx``, the cotangent of the softmax input, shaped like ``y``.
    """
    y = np.asarray(y)
    dy = np.asarray(dy, dtype=compute_dtype(np.result_type(y.dtype, np.asarray(dy).dtype)))
    y = y.astype(dy.dtype, copy=False)
    # where(): a cotangent of inf/nan on an excluded entry (y == 0) must not leak as 0 * nan.
    dy = np.where(y != 0, dy, 0.0)
    return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


def log_softmax_backward(y: np.ndarray, dy: np.ndarray, axis: int = -1) -> np.ndarray:
    """VJP of :func:`log_softmax`: ``dx = dy - softmax(x) * sum(dy)`` along ``axis``.

    Derivation: ``y_i = x_i - lse(x)`` and ``d lse / dx_j = softmax(x)_j = exp(y_j)``, so
    ``dx_j = dy_j - exp(y_j) sum_i dy_i``. An excluded entry (input ``-inf``, output
    ``-inf``) gets gradient 0 and contributes nothing to the sum: that input cannot move the
    output, and an empty row gets all zeros.

    Args:
        y: the log-softmax output.
        dy: the cotangent of ``y``, same shape.
        axis: the normalised axis.

    Returns:
        ``dx``, shaped like ``y``.
    """
    y = np.asarray(y)
    dy = np.asarray(dy, dtype=compute_dtype(np.result_type(y.dtype, np.asarray(dy).dtype)))
    y = y.astype(dy.dtype, copy=False)
    allowed = ~np.isneginf(y)
    dy = np.where(allowed, dy, 0.0)
    p = np.exp(y)  # exp(-inf) = 0 for excluded entries
    return np.where(allowed, dy - p * np.sum(dy, axis=axis, keepdims=True), 0.0)


def logsumexp_backward(
    x: np.ndarray, lse: np.ndarray, d_lse: np.ndarray, axis: int = -1, keepdims: bool = False
) -> np.ndarray:
    """VJP of :func:`logsumexp`: ``dx = d_lse * exp(x - lse) = d_lse * softmax(x)``.

    An all ``-inf`` row (``lse = -inf``) gets zeros, as do its ``-inf`` entries.

    Args:
        x: the forward's input.
        lse: the forward's output (with or without the reduced axis, per ``keepdims``).
        d_lse: the cotangent of ``lse``, shaped like it.
        axis, keepdims: as given to the forward.

    Returns:
        ``dx``, shaped like ``x``.
    """
    x = np.asarray(x)
    dt = compute_dtype(np.result_type(x.dtype, np.asarray(lse).dtype, np.asarray(d_lse).dtype))
    lse, d_lse = np.asarray(lse, dtype=dt), np.asarray(d_lse, dtype=dt)
    if not keepdims:
        lse, d_lse = np.expand_dims(lse, axis), np.expand_dims(d_lse, axis)
    # +inf for empty rows: exp(-inf - inf) = 0, no inf - inf.
    p = np.exp(x.astype(dt, copy=False) - np.where(np.isneginf(lse), np.inf, lse))
    return d_lse * p
