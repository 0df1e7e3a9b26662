"""The float64 arithmetic of the multi-head oracle: the attention core in any dtype and
reading (scale, softmax axis, sigmoid), projections from a module's own weights, and the
2x rule between them (:func:`attnkit.testing.assert_close_by_rule`, as the function check).

The verdict of "agrees" always comes from :func:`attnkit.check.core.oracle.oracle_attention` (the
row-by-row float64 reference); the vectorised :func:`core` here is for the search over
readings, and, in float32, the plain same-precision math whose error sets the bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..catalogue import T, Text
from ..core.oracle import measured_name, oracle_attention, rule_error

__all__ = ["core", "fit_scale", "linear", "oracle_core", "passes"]


def core(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, scale: float,
         kind: str = "softmax", dtype: Any = np.float64) -> np.ndarray:
    """Attention ``(B, H, Tq, dv)`` from q ``(B, H, Tq, d)``, k/v ``(B, Hkv, Tk, .)``.

    Args:
        keep: ``(Tq, Tk)`` bool, True = may attend.
        kind: ``"softmax"`` (over the keys), ``"queries"`` (a softmax over the queries
            axis), ``"sigmoid"`` (weights that do not sum to 1).
        dtype: the arithmetic's dtype.
    """
    dt = np.dtype(dtype)
    q, k, v = (np.asarray(a).astype(dt) for a in (q, k, v))
    G = q.shape[1] // k.shape[1]
    if G > 1:
        k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    with np.errstate(all="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * dt.type(scale)
        if kind == "sigmoid":
            w = np.where(keep, dt.type(1) / (dt.type(1) + np.exp(-s)), dt.type(0))
        else:
            axis = -1 if kind == "softmax" else -2
            s = np.where(keep, s, dt.type(-np.inf))
            top = s.max(axis, keepdims=True)
            e = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, dt.type(0))),
                         dt.type(0))
            total = e.sum(axis, keepdims=True)
            w = np.where(total > 0, e / np.where(total > 0, total, dt.type(1)), dt.type(0))
        return (w.astype(dt) @ v).astype(np.float64)


def oracle_core(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray,
                scale: float | None = None) -> np.ndarray:
    """The float64 oracle's attention ``(B, H, Tq, dv)`` (GQA: head ``h`` reads key/value
    head ``h // (H // Hkv)``)."""
    full = np.broadcast_to(keep, q.shape[:-1] + (k.shape[-2],))
    return oracle_attention(q, k, v, full, scale).out


def linear(x: np.ndarray, weight: Any, bias: Any, dtype: Any = np.float64) -> np.ndarray:
    """``x @ weight.T + bias`` in ``dtype`` from a module's tensors (float64 result)."""
    dt = np.dtype(dtype)
    w = np.asarray(weight.detach().double().numpy()).astype(dt)
    y = np.asarray(x).astype(dt) @ w.T
    if bias is not None:
        y = y + bias.detach().double().numpy().astype(dt)
    return y.astype(np.float64)


def passes(got: np.ndarray, ref: np.ndarray, base: np.ndarray, name: str) -> Text | None:
    """None when ``got`` meets the 2x rule against ``ref`` with baseline ``base``, else
    the measured error in words."""
    if got.shape != ref.shape:
        return T("measured.rule-shape", name=measured_name(name), shape=got.shape,
                 want=ref.shape)
    return rule_error(got, ref, base, 2.0, name)


def fit_scale(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray,
              got: np.ndarray, kind: str = "softmax") -> float:
    """The scale of the scores that brings :func:`core` closest to ``got`` (max error): a
    grid over 1e-3..1e3 in one batch, then a golden-section search around its best point."""
    G = q.shape[1] // k.shape[1]
    k, v = (np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)) if G > 1 else (k, v)
    S = q @ np.swapaxes(k, -1, -2)
    axis = -1 if kind == "softmax" else -2

    def errs(scales: np.ndarray) -> np.ndarray:
        s = scales.reshape((-1,) + (1,) * S.ndim) * S
        with np.errstate(all="ignore"):
            if kind == "sigmoid":
                w = np.where(keep, 1 / (1 + np.exp(-s)), 0.0)
            else:
                s = np.where(keep, s, -np.inf)
                e = np.where(keep, np.exp(s - s.max(axis, keepdims=True)), 0.0)
                w = e / e.sum(axis, keepdims=True)
            diff = np.abs(w @ v - got)
        return np.nanmax(diff.reshape(len(scales), -1), axis=1)

    grid = np.linspace(math.log(1e-3), math.log(1e3), 61)
    i = int(np.argmin(errs(np.exp(grid))))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = errs(np.exp(np.array([a, b])))
    for _ in range(45):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = errs(np.exp(np.array([a])))[0]
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = errs(np.exp(np.array([b])))[0]
    return math.exp((lo + hi) / 2)


def diagonal_masked(got: np.ndarray, cand: Any, P: dict[int, np.ndarray]) -> bool:
    """Whether the merged core ``got`` ``(B, T, H * dv)`` is causal attention with the
    diagonal masked too (``triu(ones, 0)`` as the mask, or ``tril(ones, -1)`` as the keep):
    each query sees only earlier keys. Query 0 then sees none, and modules give it 0, NaN or
    an average, so it is left out; the other rows must meet the 2x rule."""
    q, k, v = cand.split(P)
    if got.shape[1] < 3 or q.shape[2] != k.shape[2]:
        return False
    keep = np.tril(np.ones((q.shape[2], k.shape[2]), dtype=bool), -1)
    keep[0, 0] = True  # query 0's row is not compared; a key keeps its softmax finite
    scale = 1 / math.sqrt(cand.d)
    ref = cand.merge(core(q, k, v, keep, scale))[:, 1:]
    base = cand.merge(core(q, k, v, keep, scale, dtype=np.float32))[:, 1:]
    return passes(got[:, 1:], ref, base, "reading") is None
