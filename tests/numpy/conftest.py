"""Independent float64 references for the NumPy forward tests, exposed as fixtures.

Nothing here calls ``attnkit``: masks are built element by element from the definitions
in DESIGN.md ("Masks — one meaning, everywhere"), softmax is the textbook formula over
the allowed entries of a row, and attention loops over batch, head and query.
(pytest runs with ``--import-mode=importlib``, so helpers are handed out as fixtures.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest


def allowed(i: int, j: int, Tq: int, Tk: int, causal: bool, window: Any) -> bool:
    """DESIGN.md: causal keeps ``j <= i + Tk - Tq``; window ``(left, right)`` keeps
    ``diag - left <= j <= diag + right`` around that diagonal; None = unbounded."""
    diag = i + Tk - Tq
    if causal and j > diag:
        return False
    if window is not None:
        left, right = window
        if left is not None and j < diag - left:
            return False
        if right is not None and j > diag + right:
            return False
    return True


def band_keep(Tq: int, Tk: int, causal: bool = False, window: Any = None) -> np.ndarray:
    """``(Tq, Tk)`` bool, built one element at a time."""
    keep = np.zeros((Tq, Tk), dtype=bool)
    for i in range(Tq):
        for j in range(Tk):
            keep[i, j] = allowed(i, j, Tq, Tk, causal, window)
    return keep


def lengths_keep(valid_lens: Any, lead: tuple[int, ...], Tq: int, Tk: int) -> np.ndarray:
    """d2l ``valid_lens`` as bool ``lead + (Tq, Tk)``; ``lead[0]`` is the batch axis.

    1-D ``(B,)``: every query of batch row ``b`` sees keys ``j < valid_lens[b]``.
    2-D ``(B, Tq)``: query ``i`` of batch row ``b`` sees keys ``j < valid_lens[b, i]``.
    """
    vl = np.asarray(valid_lens)
    keep = np.zeros(lead + (Tq, Tk), dtype=bool)
    for idx in np.ndindex(*lead):
        b = idx[0]
        for i in range(Tq):
            n = int(vl[b]) if vl.ndim == 1 else int(vl[b, i])
            for j in range(Tk):
                keep[idx + (i, j)] = j < n
    return keep


def softmax_row(s: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, float]:
    """Weights and natural-log LSE of one row, over the kept entries only (float64).

    The row maximum is subtracted for the exponentials; an empty row gives zeros, -inf.
    """
    s = np.asarray(s, dtype=np.float64)
    idx = [j for j in range(s.shape[0]) if keep[j] and s[j] != -math.inf]
    w = np.zeros(s.shape[0])
    if not idx:
        return w, -math.inf
    m = max(s[j] for j in idx)
    e = {j: math.exp(s[j] - m) for j in idx}
    total = math.fsum(e.values())
    for j in idx:
        w[j] = e[j] / total
    return w, m + math.log(total)


def softmax_along(x: np.ndarray, axis: int) -> np.ndarray:
    """Plain float64 softmax along ``axis`` (all -inf row -> zeros), row by row."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        out[idx], _ = softmax_row(x[idx], np.ones(x.shape[-1], dtype=bool))
    return np.moveaxis(out, -1, axis)


def logsumexp_along(x: np.ndarray, axis: int) -> np.ndarray:
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    out = np.zeros(x.shape[:-1])
    for idx in np.ndindex(*x.shape[:-1]):
        _, out[idx] = softmax_row(x[idx], np.ones(x.shape[-1], dtype=bool))
    return out


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: Any = None,
    bias: Any = None,
    valid_lens: Any = None,
    causal: bool = False,
    window: Any = None,
    scale: float | None = None,
    scores: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 attention by loops: ``(out, weights, lse)``.

    ``q (..., H, Tq, Dk)``, ``k (..., Hkv, Tk, Dk)``, ``v (..., Hkv, Tk, Dv)`` with the same
    leading dims (or ``(..., T, D)`` without heads). Query head ``h`` reads key/value head
    ``h // (H // Hkv)``. ``scores`` overrides ``q k^T * scale`` (additive attention).
    Only kept keys enter a row's softmax and sum, so nothing masked can leak.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    if q.ndim == 2:
        lead: tuple[int, ...] = ()
    else:
        lead = np.broadcast_shapes(q.shape[:-2], (1,) * (q.ndim - 2))
    H = q.shape[-3] if q.ndim >= 3 else 1
    Hkv = k.shape[-3] if k.ndim >= 3 else 1
    G = H // Hkv
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    keep = np.ones(lead + (Tq, Tk), dtype=bool)
    if mask is not None:
        keep &= np.broadcast_to(np.asarray(mask), keep.shape)
    if valid_lens is not None:
        keep &= lengths_keep(valid_lens, lead, Tq, Tk)
    keep &= band_keep(Tq, Tk, causal, window)
    b_full = None if bias is None else np.broadcast_to(np.asarray(bias, np.float64), keep.shape)

    out = np.zeros(lead + (Tq, Dv))
    weights = np.zeros(lead + (Tq, Tk))
    lse = np.zeros(lead + (Tq,))
    for idx in np.ndindex(*lead):
        # key/value index: the same leading dims, head h -> h // G
        kidx = idx if q.ndim < 3 else idx[:-1] + (idx[-1] // G,)
        for i in range(Tq):
            if scores is None:
                row = np.array([np.dot(q[idx + (i,)], k[kidx + (j,)]) * scale for j in range(Tk)])
            else:
                row = np.asarray(scores[idx + (i,)], dtype=np.float64).copy()
            if b_full is not None:
                row = row + b_full[idx + (i,)]
            w, lse[idx + (i,)] = softmax_row(row, keep[idx + (i,)])
            weights[idx + (i,)] = w
            acc = np.zeros(Dv)
            for j in range(Tk):
                if w[j] != 0.0:
                    acc += w[j] * v[kidx + (j,)]
            out[idx + (i,)] = acc
    return out, weights, lse


class Reference:
    """Namespace handed to tests by the ``ref`` fixture."""

    allowed = staticmethod(allowed)
    band_keep = staticmethod(band_keep)
    lengths_keep = staticmethod(lengths_keep)
    softmax_row = staticmethod(softmax_row)
    softmax = staticmethod(softmax_along)
    logsumexp = staticmethod(logsumexp_along)
    attention = staticmethod(attention)


@pytest.fixture
def ref() -> type[Reference]:
    return Reference


@contextlib.contextmanager
def _unchanged(*arrays: Any) -> Iterator[None]:
    """Assert every array is bitwise equal (values, NaN positions, dtype) after the block."""
    snapshots = [None if a is None else np.array(a, copy=True) for a in arrays]
    yield
    for n, (a, before) in enumerate(zip(arrays, snapshots)):
        if a is None:
            continue
        after = np.asarray(a)
        assert after.dtype == before.dtype, f"argument {n}: dtype changed"
        assert after.shape == before.shape, f"argument {n}: shape changed"
        # Compare bytes: bitwise, so -0.0 vs 0.0 and NaN payloads count too.
        assert after.tobytes() == before.tobytes(), f"argument {n} was modified"


@pytest.fixture
def unchanged():
    """``with unchanged(q, k, v): op(q, k, v)`` fails if the op wrote into an input."""
    return _unchanged
