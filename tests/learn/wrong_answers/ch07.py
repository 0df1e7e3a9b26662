"""Typical wrong answers to the exercises of chapter 7, each with the finding that names it.

The checker has no code of its own for a KV cache that returns the wrong keys: those
answers get ``inaccurate`` (the output is off, with the measured error).
"""

from __future__ import annotations

import numpy as np


def causal_keep_top_left(Tq, Tk):
    """``np.tril`` with no offset: top-left, as PyTorch's ``is_causal``; a new token then
    sees key 0 only."""
    return np.tril(np.ones((Tq, Tk), dtype=bool))


def causal_keep_sign_flipped(Tq, Tk):
    """The offset with the wrong sign, ``k = Tq - Tk``."""
    return np.tril(np.ones((Tq, Tk), dtype=bool), k=Tq - Tk)


def causal_keep_future(Tq, Tk):
    """``np.triu``: every query sees the future instead of the past."""
    return np.triu(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)


class _Cache:
    def __init__(self, lead, capacity, Dk, Dv):
        self.k, self.v = np.zeros((*lead, capacity, Dk)), np.zeros((*lead, capacity, Dv))
        self.length = 0

    def append(self, k_new, v_new):
        t = k_new.shape[-2]
        self.k[..., self.length:self.length + t, :] = k_new
        self.v[..., self.length:self.length + t, :] = v_new
        self.length += t

    def keys(self):
        return self.k[..., :self.length, :]

    def values(self):
        return self.v[..., :self.length, :]


class KVCacheWritesAtZero(_Cache):
    """Every append writes at position 0: the cache only ever holds the newest key."""

    def append(self, k_new, v_new):
        t = k_new.shape[-2]
        self.k[..., :t, :], self.v[..., :t, :] = k_new, v_new
        self.length += t


class KVCacheWholeCapacity(_Cache):
    """keys()/values() return every slot: the unfilled, zero slots are attended too."""

    def keys(self):
        return self.k

    def values(self):
        return self.v


class KVCacheConcatenatesAcrossCalls(_Cache):
    """``np.concatenate`` onto the preallocated zeros: the new keys land after the
    capacity, and the filled part read back is the zeros."""

    def append(self, k_new, v_new):
        self.k = np.concatenate([self.k, k_new], axis=-2)
        self.v = np.concatenate([self.v, v_new], axis=-2)
        self.length += k_new.shape[-2]


WRONG = [
    ("causal_keep", causal_keep_top_left, "causal-alignment"),
    ("causal_keep", causal_keep_sign_flipped, "causal-leak"),
    ("causal_keep", causal_keep_future, "causal-leak"),
    ("KVCache", KVCacheWritesAtZero, "inaccurate"),
    ("KVCache", KVCacheWholeCapacity, "inaccurate"),
    ("KVCache", KVCacheConcatenatesAcrossCalls, "inaccurate"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report, where words that are not code have their Chinese
# after a |): the line to change.
DIAGNOSIS = {
    "causal_keep_top_left": r"bottom-right|右下角",
    "causal_keep_sign_flipped": r"j <= i \+ Tk - Tq",
    "causal_keep_future": r"j <= i \+ Tk - Tq",
    "KVCacheWritesAtZero": r"length|cache|append",
    "KVCacheWholeCapacity": r"length|filled|cache",
    "KVCacheConcatenatesAcrossCalls": r"cache|append",
}
