"""A preallocated key/value cache for incremental decoding.

Layout (read in place by :func:`attnkit.triton.decode_attention`)::

    k  (B, Hkv, capacity, Dk)     positions [0, length) hold the keys seen so far
    v  (B, Hkv, capacity, Dv)     same for the values
    length                        an int, how many positions are filled

A *self-attention* cache grows by :meth:`KVCache.append` at every decoding step. A
*cross-attention* cache (``cross=True``) is filled once with the encoder's keys and values
and reused by every later step, so the encoder output is projected once per sequence, not
once per generated token.

The cache is an ``nn.Module`` with ``k`` and ``v`` as buffers and ``length``/``cross`` as
extra state, so ``state_dict()``/``load_state_dict()``, ``torch.save`` and ``.to(device)``
work as for any module.

The buffers start as zeros and a position past ``length`` is never read, so attention
over the cache never meets a value that nobody wrote; what a call appends is stored as it
is (NaN included: attending it propagates it, as in plain math).

Decoding is inference: appended keys and values are stored detached, so no gradient flows
into earlier steps through the cache (train with one full causal forward instead); the
positions a call appends are attended live, so that call's projections do get one.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["KVCache"]


class KVCache(nn.Module):
    """Keys and values of past positions, preallocated to ``capacity``.

    Every size is keyword-only: four ints in a row are too easy to swap silently.

    Args:
        batch_size: ``B``.
        num_kv_heads: ``Hkv``.
        capacity: the most positions the cache can hold.
        head_dim: ``Dk``.
        v_head_dim: ``Dv`` (defaults to ``head_dim``).
        cross: True for a cross-attention cache, filled once and then read only.
        device, dtype: of the buffers.
    """

    k: torch.Tensor
    v: torch.Tensor

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        capacity: int,
        head_dim: int,
        v_head_dim: int | None = None,
        cross: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, n in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                        ("capacity", capacity), ("head_dim", head_dim)):
            if not isinstance(n, int) or n < (0 if name == "capacity" else 1):
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        Dv = head_dim if v_head_dim is None else v_head_dim
        kw = {"device": device, "dtype": dtype}
        self.register_buffer("k", torch.zeros(batch_size, num_kv_heads, capacity, head_dim, **kw))
        self.register_buffer("v", torch.zeros(batch_size, num_kv_heads, capacity, Dv, **kw))
        self.length: int = 0
        self.cross = bool(cross)

    def __setattr__(self, name: str, value: Any) -> None:
        # `length` changes at every decoding step: a plain attribute, set without
        # nn.Module's search of its parameters, buffers and submodules.
        if name == "length":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def keys(self) -> torch.Tensor:
        """The filled keys ``(B, Hkv, length, Dk)`` (a view, no copy)."""
        return self.k[:, :, : self.length]

    def values(self) -> torch.Tensor:
        """The filled values ``(B, Hkv, length, Dv)`` (a view, no copy)."""
        return self.v[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``T`` new positions after the filled ones.

        Args:
            k: ``(B, Hkv, T, Dk)``.
            v: ``(B, Hkv, T, Dv)``.

        Raises:
            ValueError: on a shape mismatch, or when ``length + T > capacity``; the cache
                is left unchanged.
        """
        B, Hkv, cap, Dk = self.k.shape
        Dv = self.v.shape[-1]
        if k.ndim != 4 or v.ndim != 4 or k.shape[:2] != (B, Hkv) or k.shape[-1] != Dk \
                or v.shape[:3] != k.shape[:3] or v.shape[-1] != Dv:
            raise ValueError(
                f"cache expects k (B, Hkv, T, Dk) = ({B}, {Hkv}, T, {Dk}) and v (B, Hkv, T, Dv) "
                f"= ({B}, {Hkv}, T, {Dv}), got k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        T = k.shape[2]
        if self.length + T > cap:
            raise ValueError(
                f"KV cache overflow: {self.length} positions filled + {T} new > capacity {cap} "
                f"(cache k {tuple(self.k.shape)}); nothing was written"
            )
        new = slice(self.length, self.length + T)
        with torch.no_grad():
            self.k[:, :, new] = k
            self.v[:, :, new] = v
        self.length += T

    def reset(self) -> None:
        """Forget every position (the buffers are kept and overwritten later)."""
        self.length = 0

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # Caches saved by earlier versions held a `nonfinite` buffer (codes of NaN/inf
        # written into them); it is no longer kept, so it is dropped here.
        if state_dict.pop(prefix + "nonfinite", None) is not None:
            warnings.warn("KVCache: ignoring the `nonfinite` buffer of an older state_dict "
                          "(no longer kept)", DeprecationWarning, stacklevel=2)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def get_extra_state(self) -> dict[str, Any]:
        return {"length": self.length, "cross": self.cross}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        length = int(state["length"])
        if not 0 <= length <= self.capacity:
            raise ValueError(f"saved length {length} does not fit capacity {self.capacity}")
        self.length = length
        self.cross = bool(state.get("cross", False))

    def extra_repr(self) -> str:
        kind = "cross" if self.cross else "self"
        return (f"{kind}, length={self.length}, k={tuple(self.k.shape)}, "
                f"v={tuple(self.v.shape)}, dtype={self.k.dtype}")
