"""Solutions to the exercises of chapter 7, "Decoding with a KV cache"."""

from __future__ import annotations

import numpy as np


def causal_keep(Tq: int, Tk: int) -> np.ndarray:
    """Bottom-right causal mask, ``(Tq, Tk)``, True = may attend: the queries are the last
    ``Tq`` of ``Tk`` positions, so query ``i`` sees keys ``j <= i + Tk - Tq``."""
    return np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)


class KVCache:
    """Keys and values of past positions, preallocated and filled front to back.

    Args:
        lead: the leading shape, e.g. ``(B, H)``.
        capacity: the most positions it holds.
        Dk, Dv: key and value widths.
    """

    def __init__(self, lead: tuple[int, ...], capacity: int, Dk: int, Dv: int) -> None:
        self.k = np.zeros((*lead, capacity, Dk))
        self.v = np.zeros((*lead, capacity, Dv))
        self.length = 0                                  # positions filled so far

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Write ``k_new (..., t, Dk)`` and ``v_new (..., t, Dv)`` after the filled part."""
        t = k_new.shape[-2]
        if self.length + t > self.k.shape[-2]:
            raise ValueError(f"KVCache: {self.length} + {t} positions exceed the capacity "
                             f"{self.k.shape[-2]}")
        self.k[..., self.length:self.length + t, :] = k_new
        self.v[..., self.length:self.length + t, :] = v_new
        self.length += t

    def keys(self) -> np.ndarray:
        """The filled keys, ``(..., length, Dk)``."""
        return self.k[..., :self.length, :]

    def values(self) -> np.ndarray:
        """The filled values, ``(..., length, Dv)``."""
        return self.v[..., :self.length, :]
