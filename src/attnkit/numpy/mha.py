"""Multi-head attention with explicit parameters.

Parameters live in :class:`MultiHeadParams`, stored per head (the layout seed 001 draws)::

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

from .attention import (
    AttentionCache,
    attend,
    attend_backward,
    check_qkv,
    finite_or_zero,
    scaled_scores,
    scores_backward,
)
from .masks import Window
from .softmax import compute_dtype

__all__ = ["MultiHeadParams", "multi_head_attention"]

TraceFn = Callable[[str, tuple[int, ...]], None]


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


@dataclass
class MultiHeadCache:
    """Intermediates of :func:`mha_forward` kept for the backward pass (compute dtype)."""

    query: np.ndarray  # (B, Tq, Eq)
    key: np.ndarray  # (B, Tk, Ek)
    value: np.ndarray  # (B, Tk, Ev)
    q: np.ndarray  # (B, H, Tq, Dk)
    k: np.ndarray  # (B, Hkv, Tk, Dk)
    v: np.ndarray  # (B, Hkv, Tk, Dv)
    heads: np.ndarray  # (B, Tq, H*Dv), concatenated head outputs
    attention: AttentionCache
    scale: float


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``(B, T, E) x (H, E, D) -> (B, H, T, D)``."""
    y = np.einsum("bte,hed->bhtd", x, w)
    return y if b is None else y + b[:, None, :]


def _tracer(trace: bool | TraceFn) -> TraceFn | None:
    if callable(trace):
        return trace
    if trace:
        return lambda step, shape: print(f"{step}.shape={shape}")
    return None


def mha_forward(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool = False,
    window: Window | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    trace: bool | TraceFn = False,
) -> tuple[np.ndarray, MultiHeadCache]:
    """:func:`multi_head_attention` in the compute dtype, with the cache for backward."""
    say = _tracer(trace)
    key = query if key is None else key
    value = key if value is None else value
    arrays = [np.asarray(a) for a in (query, key, value)]
    for name, x, width in zip(
        ("query", "key", "value"), arrays, (params.embed_dim, params.kdim, params.vdim)
    ):
        if x.ndim != 3 or x.shape[-1] != width:
            raise ValueError(f"{name} must be (B, T, {width}), got {x.shape}")
    if arrays[1].shape[:2] != arrays[2].shape[:2] or arrays[0].shape[0] != arrays[1].shape[0]:
        raise ValueError(
            f"query {arrays[0].shape}, key {arrays[1].shape} and value {arrays[2].shape} must "
            f"share B, and key/value must share Tk"
        )
    dt = compute_dtype(np.result_type(*(a.dtype for a in arrays), params.w_q.dtype))
    query, key, value = (a.astype(dt, copy=False) for a in arrays)
    p = params.map(lambda a: a.astype(dt, copy=False))
    if say:
        say("query", query.shape)
        say("W_q", p.w_q.shape)
        say("W_k", p.w_k.shape)
        say("W_v", p.w_v.shape)
        say("W_o", p.w_o.shape)

    q = _project(query, p.w_q, p.b_q)  # (B, H, Tq, Dk)
    k = _project(key, p.w_k, p.b_k)  # (B, Hkv, Tk, Dk)
    v = _project(value, p.w_v, p.b_v)  # (B, Hkv, Tk, Dv)
    if say:
        say("q", q.shape)
        say("k", k.shape)
        say("v", v.shape)
    G = check_qkv(q, k, v)
    scores, scale = scaled_scores(q, k, G, scale)  # (B, H, Tq, Tk)
    if say:
        say("scores", scores.shape)
    out, att = attend(
        scores, v, groups=G, mask=mask, bias=bias, valid_lens=valid_lens, causal=causal,
        window=window, dropout_p=dropout_p, rng=rng,
    )  # (B, H, Tq, Dv)
    if say:
        say("weights", att.weights.shape)
        say("head outputs", out.shape)
    B, H, Tq, Dv = out.shape
    heads = out.transpose(0, 2, 1, 3).reshape(B, Tq, H * Dv)  # (B, Tq, H*Dv)
    if say:
        say("concat", heads.shape)
    y = heads @ p.w_o
    if p.b_o is not None:
        y = y + p.b_o
    if say:
        say("output", y.shape)
    return y, MultiHeadCache(query, key, value, q, k, v, heads, att, scale)


def multi_head_attention(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool = False,
    window: Window | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    trace: bool | TraceFn = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention, batch-first.

    Args:
        params: the layer's weights (:class:`MultiHeadParams`).
        query: ``(B, Tq, Eq)``.
        key: ``(B, Tk, Ek)``; None = self-attention (``key = query``).
        value: ``(B, Tk, Ev)``; None = ``key``.
        mask, bias, valid_lens, causal, window, scale, dropout_p, rng: as in
            :func:`scaled_dot_product_attention`, on scores ``(B, H, Tq, Tk)``.
        trace: True prints the shape at every step; a callable ``fn(step, shape)`` receives
            them instead.

    Returns:
        ``(out (B, Tq, Eo), weights (B, H, Tq, Tk))``, weights pre-dropout.
    """
    y, cache = mha_forward(
        params, query, key, value, mask=mask, bias=bias, valid_lens=valid_lens,
        causal=causal, window=window, scale=scale, dropout_p=dropout_p, rng=rng, trace=trace,
    )
    dt = np.result_type(np.asarray(query).dtype, params.w_q.dtype)
    dt = dt if np.issubdtype(dt, np.floating) else np.dtype(np.float64)
    return y.astype(dt, copy=False), cache.attention.weights.astype(dt, copy=False)


# -- backward -----------------------------------------------------------------------------


def _project_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, has_bias: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """VJP of :func:`_project` (``y[b,h,t,d] = sum_e x[b,t,e] w[h,e,d] + b[h,d]``):
    ``dx = sum_hd dy w``, ``dw = sum_bt x dy``, ``db = sum_bt dy``."""
    dx = np.einsum("bhtd,hed->bte", dy, w, optimize=True)
    dw = np.einsum("bte,bhtd->hed", finite_or_zero(x), dy, optimize=True)
    return dx, dw, (dy.sum(axis=(0, 2)) if has_bias else None)


def mha_backward(
    d_y: np.ndarray, params: MultiHeadParams, cache: MultiHeadCache
) -> tuple[MultiHeadParams, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """VJP of :func:`mha_forward` given its cache.

    The forward is four linear maps around an attention; the backward runs them in reverse:
    ``y = heads W_o + b_o`` gives ``d heads = dy W_o^T``, ``dW_o = heads^T dy``,
    ``db_o = sum dy``; the heads are split back to ``(B, H, Tq, Dv)``; the attention
    backward (:func:`~attnkit.numpy.attention.attend_backward`,
    :func:`~attnkit.numpy.attention.scores_backward`) gives ``dq, dk, dv`` (GQA sums over
    groups); each per-head projection then sends its gradient to its input and weights.

    Args:
        d_y: cotangent of the output, ``(B, Tq, Eo)``.
        params: the parameters the forward used.
        cache: the forward's :class:`MultiHeadCache`.

    Returns:
        ``(d_params, d_query, d_key, d_value, d_scores)`` in the compute dtype.
        ``d_key``/``d_value`` are the gradients of the key/value arrays the forward *used*:
        when the caller passed ``key=None`` (self-attention) they belong to ``query``, and
        the caller adds them up (:func:`attnkit.numpy.vjp` does). ``d_scores
        (B, H, Tq, Tk)`` is the gradient of an additive ``bias`` before it is summed to the
        bias's shape.
    """
    dt = cache.q.dtype
    p = params.map(lambda a: a.astype(dt, copy=False))
    d_y = np.asarray(d_y).astype(dt, copy=False)
    B, Tq, _ = d_y.shape
    H, Dv = p.num_heads, p.v_head_dim

    d_heads = d_y @ p.w_o.T  # (B, Tq, H*Dv)
    d_w_o = cache.heads.reshape(-1, H * Dv).T @ d_y.reshape(-1, d_y.shape[-1])
    d_b_o = d_y.sum(axis=(0, 1)) if p.b_o is not None else None
    d_out = d_heads.reshape(B, Tq, H, Dv).transpose(0, 2, 1, 3)  # (B, H, Tq, Dv)

    att = cache.attention
    d_scores, d_v = attend_backward(d_out, cache.v, att)
    d_q, d_k = scores_backward(d_scores, cache.q, cache.k, cache.scale, att.groups)

    d_query, d_w_q, d_b_q = _project_backward(d_q, cache.query, p.w_q, p.b_q is not None)
    d_key, d_w_k, d_b_k = _project_backward(d_k, cache.key, p.w_k, p.b_k is not None)
    d_value, d_w_v, d_b_v = _project_backward(d_v, cache.value, p.w_v, p.b_v is not None)
    d_params = MultiHeadParams(
        w_q=d_w_q, w_k=d_w_k, w_v=d_w_v, w_o=d_w_o, b_q=d_b_q, b_k=d_b_k, b_v=d_b_v, b_o=d_b_o
    )
    return d_params, d_query, d_key, d_value, d_scores
