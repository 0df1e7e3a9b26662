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

Padding is cache state too: :meth:`KVCache.append` takes which of its positions are real
tokens, and :meth:`KVCache.padding_mask` hands every later step the key mask of all
positions held, a view of one ``(B, capacity)`` buffer that grows with the cache (built
once per cache, never once per step). :meth:`reset` forgets it and :meth:`reorder` (beam
search) moves it with the keys and values, so it cannot outlive what it describes.

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
        # key_valid[b, j]: position j of row b is a real token (False = padding). Allocated
        # here, not on first use, so that it is never an inference tensor that a later step
        # outside torch.inference_mode() could not write.
        self.register_buffer("key_valid", torch.ones(batch_size, capacity, dtype=torch.bool,
                                                     device=device), persistent=False)
        self.length: int = 0
        self.padded = False  # some position in [0, length) was appended as padding
        self._padded_to = 0  # key_valid is True from here on (positions never padded)
        self._keys_of: torch.Tensor | None = None  # the buffer that _keys views
        self._keys = self.key_valid
        self.cross = bool(cross)

    def __setattr__(self, name: str, value: Any) -> None:
        # `length` changes at every decoding step: a plain attribute, set without
        # nn.Module's search of its parameters, buffers and submodules.
        if name in ("length", "padded", "_padded_to", "_keys", "_keys_of"):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def sizes(self) -> tuple[int, int, int, int]:
        """``(B, Hkv, Dk, Dv)`` of the buffers."""
        k_buf, v_buf = self._buffers["k"], self._buffers["v"]
        assert k_buf is not None and v_buf is not None
        return (k_buf.shape[0], k_buf.shape[1], k_buf.shape[3], v_buf.shape[3])

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def keys(self) -> torch.Tensor:
        """The filled keys ``(B, Hkv, length, Dk)`` (a view, no copy)."""
        return self._buffers["k"][:, :, : self.length]  # type: ignore[index]

    def values(self) -> torch.Tensor:
        """The filled values ``(B, Hkv, length, Dv)`` (a view, no copy)."""
        return self._buffers["v"][:, :, : self.length]  # type: ignore[index]

    def append(
        self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None = None
    ) -> None:
        """Write ``T`` new positions after the filled ones.

        Args:
            k: ``(B, Hkv, T, Dk)``.
            v: ``(B, Hkv, T, Dv)``.
            valid: ``(B, T)`` bool (or 0/1), True = a real token, False = padding that no
                later query attends; None = all real.

        Raises:
            ValueError: on a shape mismatch, or when ``length + T > capacity``; the cache
                is left unchanged.
        """
        # The buffers straight from nn.Module's table: a decoding step calls this per
        # layer, and each `self.k` would be a Python-level __getattr__.
        k_buf, v_buf = self._buffers["k"], self._buffers["v"]
        assert k_buf is not None and v_buf is not None
        B, Hkv, cap, Dk = k_buf.shape
        Dv = v_buf.shape[-1]
        if k.ndim != 4 or v.ndim != 4 or k.shape[:2] != (B, Hkv) or k.shape[-1] != Dk \
                or v.shape[:3] != k.shape[:3] or v.shape[-1] != Dv:
            raise ValueError(
                f"cache expects k (B, Hkv, T, Dk) = ({B}, {Hkv}, T, {Dk}) and v (B, Hkv, T, Dv) "
                f"= ({B}, {Hkv}, T, {Dv}), got k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        T = k.shape[2]
        if valid is not None and (not isinstance(valid, torch.Tensor)
                                  or tuple(valid.shape) != (B, T)):
            raise ValueError(f"padding of the {T} new positions must be a (B, T) = ({B}, {T}) "
                             f"tensor, got {tuple(getattr(valid, 'shape', ())) or valid!r}")
        if self.length + T > cap:
            raise ValueError(
                f"KV cache overflow: {self.length} positions filled + {T} new > capacity {cap} "
                f"(cache k {tuple(k_buf.shape)}); nothing was written"
            )
        start, end = self.length, self.length + T
        if torch.is_grad_enabled():  # stored detached (a decoding step is already so)
            with torch.no_grad():
                self._write(k_buf, v_buf, start, end, k, v, valid)
        else:
            self._write(k_buf, v_buf, start, end, k, v, valid)
        self.length = end

    def _write(self, k_buf: torch.Tensor, v_buf: torch.Tensor, start: int, end: int,
               k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> None:
        k_buf[:, :, start:end] = k
        v_buf[:, :, start:end] = v
        if valid is not None:
            self.key_valid[:, start:end] = valid if valid.dtype == torch.bool else valid != 0
            self.padded, self._padded_to = True, max(self._padded_to, end)
        elif start < self._padded_to:  # positions once written as padding: real now
            self.key_valid[:, start:min(end, self._padded_to)] = True

    def padding_mask(self) -> torch.Tensor | None:
        """The key mask of the positions held, ``(B, 1, 1, length)`` bool (True = may
        attend; a view of the cache's own buffer), or None when none was appended as
        padding since the last :meth:`reset`."""
        if not self.padded:
            return None
        key_valid = self._buffers["key_valid"]  # not nn.Module's __getattr__: once a step
        if self._keys_of is not key_valid:  # made once per buffer (.to() makes another)
            self._keys, self._keys_of = key_valid[:, None, None, :], key_valid
        return self._keys[..., : self.length]

    def reset(self) -> None:
        """Forget every position and its padding (the buffers are kept and overwritten
        later)."""
        self.length = 0
        self.padded = False

    def reorder(self, index: torch.Tensor) -> None:
        """Reorder the batch rows in place: row ``b`` becomes old row ``index[b]`` (beam
        search keeps the best beams), keys, values and padding alike.

        Args:
            index: ``(B,)`` integer tensor of rows (repeats allowed), on any device.
        """
        B = self.k.shape[0]
        if not isinstance(index, torch.Tensor) or tuple(index.shape) != (B,) \
                or index.is_floating_point() or index.dtype == torch.bool:
            raise ValueError(f"reorder takes a ({B},) integer tensor of batch rows, got "
                             f"{getattr(index, 'dtype', type(index).__name__)} "
                             f"{tuple(getattr(index, 'shape', ()))}")
        index = index.to(self.k.device)
        held = slice(0, self.length)
        with torch.no_grad():
            self.k[:, :, held] = self.k[:, :, held].index_select(0, index)
            self.v[:, :, held] = self.v[:, :, held].index_select(0, index)
            if self._padded_to:
                self.key_valid.copy_(self.key_valid.index_select(0, index))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # Caches saved by earlier versions held a `nonfinite` buffer (codes of NaN/inf
        # written into them); it is no longer kept, so it is dropped here.
        if state_dict.pop(prefix + "nonfinite", None) is not None:
            warnings.warn("KVCache: ignoring the `nonfinite` buffer of an older state_dict "
                          "(no longer kept)", DeprecationWarning, stacklevel=2)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def get_extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"length": self.length, "cross": self.cross}
        if self.padded:
            state["key_valid"] = self.key_valid[:, : self.length].clone()
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        length = int(state["length"])
        if not 0 <= length <= self.capacity:
            raise ValueError(f"saved length {length} does not fit capacity {self.capacity}")
        self.length = length
        self.cross = bool(state.get("cross", False))
        valid = state.get("key_valid")
        self.padded = valid is not None
        if valid is not None:
            with torch.no_grad():
                self.key_valid[:, :length] = valid.to(self.key_valid.device)
                self.key_valid[:, length:] = True
            self._padded_to = length

    def extra_repr(self) -> str:
        kind = "cross" if self.cross else "self"
        return (f"{kind}, length={self.length}, k={tuple(self.k.shape)}, "
                f"v={tuple(self.v.shape)}, dtype={self.k.dtype}")
