"""Float64 references for the NumPy forward tests, exposed as fixtures.

The attention reference is :func:`attnkit.testing.reference_attention`, the one float64
reference of every backend's tests: it builds masks element by element from the definitions
in DESIGN.md ("Masks — one meaning, everywhere"), takes the textbook softmax over the
allowed entries of each row, and calls no attnkit backend, so it can judge the oracle
itself. Softmax and log-sum-exp along an axis are its row softmax applied row by row.
(pytest runs with ``--import-mode=importlib``, so helpers are handed out as fixtures.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from attnkit.testing import allowed, band_keep, lengths_keep, reference_attention, softmax_row


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


def attention(q: Any, k: Any, v: Any, **options: Any) -> tuple[np.ndarray, ...]:
    """Float64 attention ``(out, weights, lse)`` (:func:`attnkit.testing.reference_attention`;
    ``scores=`` overrides ``q k^T * scale`` for additive attention)."""
    ref = reference_attention(q, k, v, **options)
    return ref.out, ref.weights, ref.lse


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
