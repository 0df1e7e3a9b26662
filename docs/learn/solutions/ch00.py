"""Solutions to the exercises of chapter 0, "Start here".

Each function has the name and the signature the exercise asks for; the exercise's grading
cell passes it to `attnkit.check` (or compares it with attnkit) and reports no finding.
"""

from __future__ import annotations

import numpy as np


def soft_lookup(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention as a soft lookup.

    Args:
        q: queries, ``(..., Tq, D)``.
        k: keys, ``(..., Tk, D)``.
        v: values, ``(..., Tk, Dv)``.

    Returns:
        ``(..., Tq, Dv)``: for every query, the average of the values weighted by how well
        the query matches each key.
    """
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., Tq, Tk)
    scores = scores - scores.max(axis=-1, keepdims=True)         # the max trick (chapter 1)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)     # each row sums to 1
    return weights @ v                                           # (..., Tq, Dv)


def positional_encoding(T: int, E: int) -> np.ndarray:
    """The sinusoidal positional encoding of "Attention Is All You Need" (and d2l).

    Args:
        T: number of positions.
        E: model width (even or odd).

    Returns:
        ``(T, E)``: ``P[t, 2i] = sin(t / 10000^(2i/E))``, ``P[t, 2i+1] = cos(same angle)``.
    """
    t = np.arange(T)[:, None]                       # (T, 1) positions
    two_i = np.arange(0, E, 2)[None, :]              # (1, ceil(E/2)): 0, 2, 4, ...
    angle = t / 10000.0 ** (two_i / E)               # (T, ceil(E/2))
    P = np.zeros((T, E))
    P[:, 0::2] = np.sin(angle)
    P[:, 1::2] = np.cos(angle[:, : E // 2])          # odd E: one fewer cosine column
    return P
