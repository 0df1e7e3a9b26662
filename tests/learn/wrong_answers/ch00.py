"""Typical wrong answers to the exercises of chapter 0, each with the finding that names it.

``WRONG`` lists ``(exercise name, wrong answer, finding code)``; ``"mismatch"`` marks an
exercise graded by comparison with attnkit rather than by ``attnkit check``.
"""

from __future__ import annotations

import numpy as np


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def soft_lookup_dot_T(q, k, v):
    """``k.T`` on a batch: it reverses every axis, not the last two (right for one
    sequence only: checked one sequence at a time, with a warning)."""
    return _softmax(q @ k.T / np.sqrt(q.shape[-1])) @ v


def soft_lookup_unscaled(q, k, v):
    """The 1/sqrt(D) forgotten."""
    return _softmax(q @ np.swapaxes(k, -1, -2)) @ v


def soft_lookup_value_width(q, k, v):
    """Scaled by the width of the values instead of the keys."""
    return _softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(v.shape[-1])) @ v


def soft_lookup_over_queries(q, k, v):
    """The softmax taken over the queries (axis -2), not over the keys."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-2, keepdims=True))
    return e / e.sum(axis=-2, keepdims=True) @ v


def soft_lookup_no_max(q, k, v):
    """``np.exp`` of the raw scores: overflows once scores pass ~709."""
    e = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    return e / e.sum(axis=-1, keepdims=True) @ v


def positional_encoding_swapped(T, E):
    """cos in the even columns, sin in the odd ones."""
    angle = np.arange(T)[:, None] / 10000.0 ** (np.arange(0, E, 2)[None, :] / E)
    P = np.zeros((T, E))
    P[:, 0::2] = np.cos(angle)
    P[:, 1::2] = np.sin(angle[:, : E // 2])
    return P


def positional_encoding_pair_index(T, E):
    """The exponent uses the pair index i instead of 2i."""
    angle = np.arange(T)[:, None] / 10000.0 ** (np.arange(0, (E + 1) // 2)[None, :] / E)
    P = np.zeros((T, E))
    P[:, 0::2] = np.sin(angle)
    P[:, 1::2] = np.cos(angle[:, : E // 2])
    return P



def positional_encoding_exponent_over_pairs(T, E):
    """The exponent divided by the number of pairs (E / 2) instead of by E."""
    angle = np.arange(T)[:, None] / 10000.0 ** (np.arange(0, E, 2)[None, :] / (E // 2))
    P = np.zeros((T, E))
    P[:, 0::2] = np.sin(angle)
    P[:, 1::2] = np.cos(angle[:, : E // 2])
    return P


WRONG = [
    ("soft_lookup", soft_lookup_dot_T, "one-sequence"),
    ("soft_lookup", soft_lookup_unscaled, "wrong-scale"),
    ("soft_lookup", soft_lookup_value_width, "wrong-scale"),
    ("soft_lookup", soft_lookup_over_queries, "inaccurate"),
    ("soft_lookup", soft_lookup_no_max, "nan-or-inf"),
    ("positional_encoding", positional_encoding_swapped, "mismatch"),
    ("positional_encoding", positional_encoding_pair_index, "mismatch"),
    ("positional_encoding", positional_encoding_exponent_over_pairs, "mismatch"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report): the line to change. Answers graded by comparison
# ("mismatch") have no report.
DIAGNOSIS = {
    "soft_lookup_dot_T": r"transpose|swapaxes",
    "soft_lookup_unscaled": r"sqrt\(Dk\)",
    "soft_lookup_value_width": r"Dv\b",
    "soft_lookup_over_queries": r"axis|over the keys",
    "soft_lookup_no_max": r"max",
}
