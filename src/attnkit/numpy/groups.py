"""Grouped-query attention without copies, and the sums its backward needs.

When q has ``H`` heads and k/v have ``Hkv`` (``G = H // Hkv``), query head ``h`` reads
key/value head ``h // G``. K and V are never repeated ``G`` times: queries are viewed as
``(..., Hkv, G, T, D)`` and K/V as ``(..., Hkv, 1, T, D)``, and matmul broadcasts over ``G``.
Backward, a shared K/V head's gradient is the sum over its ``G`` query heads; stacking the
heads of a group along the time axis (:func:`fold_groups`) takes that sum inside one matmul.
Every function here is the identity reshaping when ``G == 1``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "fold_grouped",
    "fold_groups",
    "group_sum_matmul",
    "grouped",
    "grouped_matmul",
    "kv_grouped",
    "sum_to_shape",
    "ungrouped",
]


def grouped(q: np.ndarray, G: int) -> np.ndarray:
    """View ``(..., H, T, D)`` as ``(..., Hkv, G, T, D)`` (no copy)."""
    if G == 1:
        return q
    H = q.shape[-3]
    return q.reshape(q.shape[:-3] + (H // G, G) + q.shape[-2:])


def kv_grouped(x: np.ndarray, G: int) -> np.ndarray:
    """View k or v ``(..., Hkv, Tk, D)`` as ``(..., Hkv, 1, Tk, D)`` to broadcast over G."""
    return x if G == 1 else x[..., None, :, :]


def ungrouped(x: np.ndarray, G: int) -> np.ndarray:
    """``(..., Hkv, G, T, X)`` back to ``(..., H, T, X)``."""
    if G == 1:
        return x
    return x.reshape(x.shape[:-4] + (x.shape[-4] * G,) + x.shape[-2:])


def grouped_matmul(a: np.ndarray, b: np.ndarray, G: int) -> np.ndarray:
    """``a @ b`` with each query head reading its group's key/value head:
    ``(..., H, T, X) @ (..., Hkv, X, Y) -> (..., H, T, Y)`` (``b`` shaped like k or v, or
    their transpose)."""
    # (..., Hkv, G, T, X) @ (..., Hkv, 1, X, Y) -> (..., Hkv, G, T, Y)
    return ungrouped(grouped(a, G) @ kv_grouped(b, G), G)


def fold_groups(x: np.ndarray, G: int) -> np.ndarray:
    """``(..., H, T, X)`` as ``(..., Hkv, G*T, X)``: the G heads of a group stacked along T."""
    if G == 1:
        return x
    return x.reshape(x.shape[:-3] + (x.shape[-3] // G, G * x.shape[-2], x.shape[-1]))


def fold_grouped(x: np.ndarray, G: int) -> np.ndarray:
    """A grouped ``(..., Hkv, G, T, X)`` as ``(..., Hkv, G*T, X)``, as :func:`fold_groups`
    does for the ungrouped layout (the blockwise backward keeps its tiles grouped)."""
    if G == 1:
        return x
    return x.reshape(x.shape[:-3] + (G * x.shape[-2], x.shape[-1]))


def group_sum_matmul(a: np.ndarray, b: np.ndarray, G: int) -> np.ndarray:
    """``sum over the G heads of a group of a^T @ b``: ``(..., H, T, X), (..., H, T, Y) ->
    (..., Hkv, X, Y)``. Contracting over the folded ``G*T`` axis does the group sum."""
    return np.swapaxes(fold_groups(a, G), -1, -2) @ fold_groups(b, G)


def sum_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes broadcasting added or stretched, giving an array of ``shape``.

    The backward of ``broadcast_to(a, x.shape)``: every copy of an entry of ``a`` sends its
    gradient back to that one entry.
    """
    shape = tuple(shape)
    extra = x.ndim - len(shape)
    if extra > 0:
        x = x.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if stretched:
        x = x.sum(axis=stretched, keepdims=True)
    return x.reshape(shape)
