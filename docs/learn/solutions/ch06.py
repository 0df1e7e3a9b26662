"""Solutions to the exercises of chapter 6, "Flash attention"."""

from __future__ import annotations

import numpy as np


def online_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int = 3) -> np.ndarray:
    """Attention computed one block of keys at a time (the online softmax).

    Args:
        q: ``(..., Tq, Dk)``; k: ``(..., Tk, Dk)``; v: ``(..., Tk, Dv)``.
        block: keys per block.

    Returns:
        ``(..., Tq, Dv)``, equal to the plain softmax attention up to rounding.
    """
    q = q / np.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1] + (1,), -np.inf)           # running max of each query's scores
    l = np.zeros(q.shape[:-1] + (1,))                  # running sum of exp(s - m)
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])        # running sum of exp(s - m) * v
    for j0 in range(0, k.shape[-2], block):            # the last block may be shorter
        s = q @ np.swapaxes(k[..., j0:j0 + block, :], -1, -2)   # (..., Tq, block)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = np.exp(m - m_new)                      # rescales the old sums; exp(-inf) = 0
        p = np.exp(s - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., j0:j0 + block, :]
        m = m_new
    return acc / l


def merge_partials(out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the keys of A and B from the attention over each.

    Args:
        out_a, out_b: ``(..., Tq, Dv)``, each side's output (0 where it saw no key).
        lse_a, lse_b: ``(..., Tq)``, each side's log-sum-exp (``-inf`` where it saw no key).

    Returns:
        ``(out, lse)`` of the union; a side with ``lse = -inf`` weighs nothing.
    """
    lse = np.logaddexp(lse_a, lse_b)                   # log(e^a + e^b), without overflow
    safe = np.where(np.isneginf(lse), 0.0, lse)        # both sides empty: weights 0, not NaN
    w_a = np.exp(lse_a - safe)[..., None]              # A's share of the denominator
    w_b = np.exp(lse_b - safe)[..., None]
    return w_a * out_a + w_b * out_b, lse
