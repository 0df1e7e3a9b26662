"""Typical wrong answers to the exercises of chapter 6, each with the finding that names it."""

from __future__ import annotations

import numpy as np


def _online(q, k, v, block, rescale=True, shift=True, stop=None):
    """The solution's loop with switches for its usual slips."""
    q = q / np.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1] + (1,), -np.inf)
    l = np.zeros(q.shape[:-1] + (1,))
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])
    for j0 in range(0, k.shape[-2] if stop is None else stop, block):
        s = q @ np.swapaxes(k[..., j0:j0 + block, :], -1, -2)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True)) if shift else np.zeros_like(m)
        alpha = np.exp(m - m_new) if rescale else 1.0
        p = np.exp(s - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., j0:j0 + block, :]
        m = m_new
    return acc / l


def online_attention_no_rescale(q, k, v, block=3):
    """The old sums are never multiplied by exp(m_old - m_new)."""
    with np.errstate(all="ignore"):
        return _online(q, k, v, block, rescale=False)


def online_attention_no_max(q, k, v, block=3):
    """exp of the raw scores: the max trick dropped."""
    return _online(q, k, v, block, shift=False)


def online_attention_drops_last_block(q, k, v, block=3):
    """``range(0, Tk - block + 1, block)``: a shorter last block is never read."""
    return _online(q, k, v, block, stop=k.shape[-2] - block + 1)


def online_attention_average_of_blocks(q, k, v, block=3):
    """Each block normalised on its own, then the blocks averaged."""
    outs = []
    for j0 in range(0, k.shape[-2], block):
        s = q @ np.swapaxes(k[..., j0:j0 + block, :], -1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        outs.append(p / p.sum(axis=-1, keepdims=True) @ v[..., j0:j0 + block, :])
    return sum(outs) / len(outs)


def merge_partials_average(out_a, lse_a, out_b, lse_b):
    """The two halves averaged, whatever their share of the weight."""
    return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b)


def merge_partials_raw_exp(out_a, lse_a, out_b, lse_b):
    """Weights exp(lse) themselves: inf at scores near 1e3."""
    w_a, w_b = np.exp(lse_a)[..., None], np.exp(lse_b)[..., None]
    return (w_a * out_a + w_b * out_b) / (w_a + w_b), np.logaddexp(lse_a, lse_b)


def merge_partials_max_for_lse(out_a, lse_a, out_b, lse_b):
    """The merged LSE taken as max(lse_a, lse_b): the weights no longer sum to 1."""
    lse = np.maximum(lse_a, lse_b)
    return (np.exp(lse_a - lse)[..., None] * out_a + np.exp(lse_b - lse)[..., None] * out_b,
            lse)


def merge_partials_no_last_axis(out_a, lse_a, out_b, lse_b):
    """Weights (..., Tq) multiplied into (..., Tq, Dv) without ``[..., None]``."""
    lse = np.logaddexp(lse_a, lse_b)
    return np.exp(lse_a - lse) * out_a + np.exp(lse_b - lse) * out_b, lse


WRONG = [
    ("online_attention", online_attention_no_rescale, "inaccurate"),
    ("online_attention", online_attention_no_max, "nan-or-inf"),
    ("online_attention", online_attention_drops_last_block, "inaccurate"),
    ("online_attention", online_attention_average_of_blocks, "inaccurate"),
    ("merge_partials", merge_partials_average, "inaccurate"),
    ("merge_partials", merge_partials_raw_exp, "nan-or-inf"),
    ("merge_partials", merge_partials_max_for_lse, "inaccurate"),
    ("merge_partials", merge_partials_no_last_axis, "shape"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report): the line to change.
DIAGNOSIS = {
    "online_attention_no_rescale": r"alpha|rescale",
    "online_attention_no_max": r"max",
    "online_attention_drops_last_block": r"last block|block",
    "online_attention_average_of_blocks": r"alpha|rescale",
    "merge_partials_average": r"lse|LSE",
    "merge_partials_raw_exp": r"lse|LSE",
    "merge_partials_max_for_lse": r"logaddexp|lse|LSE",
    "merge_partials_no_last_axis": r"axis",
}
