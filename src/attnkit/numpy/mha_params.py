"""The weights of one multi-head attention layer, stored per head (the layout the
classic per-head diagrams draw) in :class:`MultiHeadParams`::

    w_q (H, Eq, Dk)    w_k (Hkv, Ek, Dk)    w_v (Hkv, Ev, Dv)    w_o (H*Dv, Eo)
    b_q (H, Dk)        b_k (Hkv, Dk)        b_v (Hkv, Dv)        b_o (Eo,)

``Eq`` (the query width), ``Ek``/``Ev`` (key/value input widths, for cross-attention) and
``Eo`` (output width) are free: nothing requires ``E`` to be a multiple of ``H`` once the
head dims are given. :meth:`MultiHeadParams.from_flat` reads the flattened ``(E, H*Dk)``
layout of ``nn.Linear``-style weights (column ``h*Dk + d`` is head ``h``, dim ``d``), i.e.
``nn.Linear.weight.T``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["MultiHeadParams", "head_sizes"]


def head_sizes(
    embed_dim: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None
) -> tuple[int, int, int]:
    """``(H, Hkv, Dk)`` of a layer, with the defaults ``Hkv = H`` and ``Dk = E // H``.

    Shared by :meth:`MultiHeadParams.init` and :class:`attnkit.torch.MultiHeadAttention`,
    so both build the same layer from the same arguments.
    """
    H = num_heads
    Hkv = H if num_kv_heads is None else num_kv_heads
    if H < 1 or Hkv < 1 or H % Hkv:
        raise ValueError(f"num_heads={H} must be a positive multiple of num_kv_heads={Hkv}")
    if head_dim is None:
        if embed_dim % H:
            raise ValueError(
                f"embed_dim={embed_dim} is not a multiple of num_heads={H}; pass head_dim"
            )
        head_dim = embed_dim // H
    return H, Hkv, head_dim


@dataclass
class MultiHeadParams:
    """Weights of one multi-head attention layer, per-head layout (see module docstring)."""

    w_q: np.ndarray  # (H, Eq, Dk)   query projection, one matrix per query head
    w_k: np.ndarray  # (Hkv, Ek, Dk) key projection, one per key/value head
    w_v: np.ndarray  # (Hkv, Ev, Dv) value projection
    w_o: np.ndarray  # (H*Dv, Eo)    output projection of the concatenated heads
    b_q: np.ndarray | None = None  # (H, Dk)
    b_k: np.ndarray | None = None  # (Hkv, Dk)
    b_v: np.ndarray | None = None  # (Hkv, Dv)
    b_o: np.ndarray | None = None  # (Eo,)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if val is not None:
                setattr(self, f.name, np.asarray(val))
        w_q, w_k, w_v, w_o = self.w_q, self.w_k, self.w_v, self.w_o
        if w_q.ndim != 3 or w_k.ndim != 3 or w_v.ndim != 3 or w_o.ndim != 2:
            raise ValueError(
                f"expected w_q (H, Eq, Dk), w_k (Hkv, Ek, Dk), w_v (Hkv, Ev, Dv), w_o (H*Dv, Eo); "
                f"got {w_q.shape}, {w_k.shape}, {w_v.shape}, {w_o.shape}"
            )
        H, Hkv = w_q.shape[0], w_k.shape[0]
        if w_v.shape[0] != Hkv or Hkv == 0 or H % Hkv:
            raise ValueError(
                f"heads: w_q has H={H}, w_k Hkv={Hkv}, w_v {w_v.shape[0]}; need w_k and w_v to "
                f"agree and H % Hkv == 0"
            )
        if w_q.shape[2] != w_k.shape[2]:
            raise ValueError(f"w_q {w_q.shape} and w_k {w_k.shape} must share Dk")
        if w_o.shape[0] != H * w_v.shape[2]:
            raise ValueError(f"w_o {w_o.shape} must have H*Dv = {H * w_v.shape[2]} rows")
        expected = {
            "b_q": (H, w_q.shape[2]),
            "b_k": (Hkv, w_k.shape[2]),
            "b_v": (Hkv, w_v.shape[2]),
            "b_o": (w_o.shape[1],),
        }
        for name, shape in expected.items():
            b = getattr(self, name)
            if b is not None and b.shape != shape:
                raise ValueError(f"{name} has shape {b.shape}, expected {shape}")

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return self.w_q.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.w_k.shape[0]

    @property
    def head_dim(self) -> int:
        return self.w_q.shape[2]

    @property
    def v_head_dim(self) -> int:
        return self.w_v.shape[2]

    @property
    def embed_dim(self) -> int:
        return self.w_q.shape[1]

    @property
    def kdim(self) -> int:
        return self.w_k.shape[1]

    @property
    def vdim(self) -> int:
        return self.w_v.shape[1]

    @property
    def out_dim(self) -> int:
        return self.w_o.shape[1]

    # -- containers ----------------------------------------------------------------------
    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, array)`` for every parameter present (biases may be absent)."""
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if val is not None:
                yield f.name, val

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> MultiHeadParams:
        """A new container with ``fn`` applied to every present array."""
        return dataclasses.replace(self, **{name: fn(a) for name, a in self.items()})

    def copy(self) -> MultiHeadParams:
        return self.map(np.copy)

    @classmethod
    def from_flat(
        cls,
        w_q: np.ndarray,
        w_k: np.ndarray,
        w_v: np.ndarray,
        w_o: np.ndarray,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        b_q: np.ndarray | None = None,
        b_k: np.ndarray | None = None,
        b_v: np.ndarray | None = None,
        b_o: np.ndarray | None = None,
    ) -> MultiHeadParams:
        """Build from the flattened layout: ``w_q (Eq, H*Dk)``, ``w_k (Ek, Hkv*Dk)``,
        ``w_v (Ev, Hkv*Dv)``, ``w_o (H*Dv, Eo)``, biases ``(H*Dk,)`` etc.

        ``nn.Linear(E, H*Dk).weight`` is ``(H*Dk, E)``: pass its transpose.
        """
        H = num_heads
        Hkv = H if num_kv_heads is None else num_kv_heads

        def split(w: np.ndarray, heads: int, name: str) -> np.ndarray:
            w = np.asarray(w)
            if w.ndim != 2 or w.shape[1] % heads:
                raise ValueError(f"{name} of shape {w.shape} is not (E, {heads}*D)")
            return np.ascontiguousarray(
                w.reshape(w.shape[0], heads, w.shape[1] // heads).transpose(1, 0, 2)
            )

        def split_bias(b: np.ndarray | None, heads: int, name: str) -> np.ndarray | None:
            if b is None:
                return None
            b = np.asarray(b)
            if b.ndim != 1 or b.shape[0] % heads:
                raise ValueError(f"{name} of shape {b.shape} is not ({heads}*D,)")
            return b.reshape(heads, -1)

        return cls(
            w_q=split(w_q, H, "w_q"),
            w_k=split(w_k, Hkv, "w_k"),
            w_v=split(w_v, Hkv, "w_v"),
            w_o=np.asarray(w_o),
            b_q=split_bias(b_q, H, "b_q"),
            b_k=split_bias(b_k, Hkv, "b_k"),
            b_v=split_bias(b_v, Hkv, "b_v"),
            b_o=None if b_o is None else np.asarray(b_o),
        )

    def to_flat(self) -> dict[str, np.ndarray]:
        """The flattened layout of :meth:`from_flat` (``w_q (Eq, H*Dk)`` and so on)."""
        flat: dict[str, np.ndarray] = {}
        for name in ("w_q", "w_k", "w_v"):
            w = getattr(self, name)
            flat[name] = w.transpose(1, 0, 2).reshape(w.shape[1], -1)
        flat["w_o"] = self.w_o
        for name in ("b_q", "b_k", "b_v", "b_o"):
            b = getattr(self, name)
            if b is not None:
                flat[name] = b.reshape(-1)
        return flat

    @classmethod
    def init(
        cls,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        out_dim: int | None = None,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        dtype: np.dtype | type = np.float64,
    ) -> MultiHeadParams:
        """Xavier-uniform weights (on the flattened matrices), zero biases.

        ``head_dim`` defaults to ``embed_dim // num_heads`` (then ``embed_dim`` must be a
        multiple of ``num_heads``); give it explicitly and any ``embed_dim`` works.
        """
        rng = np.random.default_rng() if rng is None else rng
        H, Hkv, head_dim = head_sizes(embed_dim, num_heads, num_kv_heads, head_dim)
        Dk, Dv = head_dim, head_dim if v_head_dim is None else v_head_dim
        Ek, Ev = kdim or embed_dim, vdim or embed_dim
        Eo = out_dim or embed_dim

        def xavier(fan_in: int, fan_out: int) -> np.ndarray:
            a = math.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-a, a, size=(fan_in, fan_out)).astype(dtype)

        def zeros(n: int) -> np.ndarray | None:
            return np.zeros(n, dtype=dtype) if bias else None

        return cls.from_flat(
            xavier(embed_dim, H * Dk), xavier(Ek, Hkv * Dk), xavier(Ev, Hkv * Dv),
            xavier(H * Dv, Eo), num_heads=H, num_kv_heads=Hkv,
            b_q=zeros(H * Dk), b_k=zeros(Hkv * Dk), b_v=zeros(Hkv * Dv), b_o=zeros(Eo),
        )
