"""An ``nn.MultiheadAttention`` call judged from the module's own weights: the float64
oracle of the whole forward (projections, masks, ``bias_k``/``bias_v``, ``add_zero_attn``,
attention by :func:`attnkit.testing.reference_attention`, the output projection) against
what the module returned, by the 2x rule against the same forward in plain math in the
module's own dtype."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...testing import reference_attention
from ..catalogue import T
from ..core.oracle import Baseline, rule_error
from ..core.readings import mask_chain, mask_parts, named_scales, polarity_reading
from .any_judge import Judged, _explain, _np, _rule

__all__ = ["judge_mha", "mha_reference"]


def _batch_first(module: Any, x: Any) -> Any:
    """``(N, L, E)`` whatever the module's layout (``(L, E)`` unbatched: N = 1)."""
    if x.ndim == 2:
        return x[None]
    return x if module.batch_first else x.transpose(0, 1)


def _projections(module: Any, q: Any, k: Any, v: Any, dtype: Any) -> tuple[Any, Any, Any]:
    import torch.nn.functional as F

    E = module.embed_dim

    def w(t: Any) -> Any:
        return None if t is None else t.detach().cpu().to(dtype)

    b = w(module.in_proj_bias)
    bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
    if module._qkv_same_embed_dim:
        W = w(module.in_proj_weight)
        wq, wk, wv = W[:E], W[E:2 * E], W[2 * E:]
    else:
        wq, wk, wv = w(module.q_proj_weight), w(module.k_proj_weight), w(module.v_proj_weight)
    return F.linear(q, wq, bq), F.linear(k, wk, bk), F.linear(v, wv, bv)


def mha_reference(module: Any, query: Any, key: Any, value: Any, key_padding_mask: Any = None,
                  attn_mask: Any = None, *, dtype: str = "float64",
                  scale: float | None = None, keep: Any = None,
                  **ignored: Any) -> tuple[np.ndarray, np.ndarray]:
    """``nn.MultiheadAttention``'s forward from its definition: ``(out (N, L, E), keep
    (N, H, L, S'))`` as float64 arrays (``S'`` counts the ``bias_k`` and zero keys).

    Args:
        module: the ``nn.MultiheadAttention`` (its weights are read, it is not called).
        query, key, value: as the module received them (its ``batch_first`` layout, or
            unbatched ``(L, E)``).
        key_padding_mask: ``(N, S)``, bool True = padding (ignored), or float (added).
        attn_mask: ``(L, S)`` or ``(N*H, L, S)``, bool True = may *not* attend, or float.
        dtype: ``"float64"`` for the oracle (attention by ``reference_attention``), or the
            module's dtype for the plain-math baseline of the 2x rule.
        scale: None = ``1/sqrt(head_dim)``; another value only to test an explanation.
        keep: None = the keys the masks allow; a bool ``(N, H, L, S')`` array (True = may
            attend) only to test an explanation (another reading of the masks).

    Returns:
        ``(out, keep)``.
    """
    import torch
    import torch.nn.functional as F

    td = getattr(torch, dtype)
    q, k, v = (_batch_first(module, x.detach().cpu()).to(td) for x in (query, key, value))
    N, L, E = q.shape
    H = module.num_heads
    hd = E // H
    q, k, v = _projections(module, q, k, v, td)
    S = k.shape[1]
    bias = torch.zeros(N, H, L, S, dtype=torch.float64)
    allowed, keep = keep, torch.ones(N, H, L, S, dtype=torch.bool)
    for m, kind in ((attn_mask, "attn"), (key_padding_mask, "pad")):
        if m is None:
            continue
        m = m.detach().cpu()
        if kind == "attn":
            m = m.reshape(N, H, L, S) if m.ndim == 3 else m.expand(N, H, L, S)
        else:
            m = m.reshape(N, 1, 1, S).expand(N, H, L, S)
        if m.dtype == torch.bool:
            keep = keep & ~m
        else:
            keep = keep & ~torch.isneginf(m.double())
            bias = bias + torch.where(torch.isfinite(m.double()), m.double(), 0.0)

    def extra_key(kx: Any, vx: Any) -> None:  # one more key every query may attend
        nonlocal k, v, keep, bias
        k, v = torch.cat([k, kx], 1), torch.cat([v, vx], 1)
        keep = torch.cat([keep, torch.ones(N, H, L, 1, dtype=torch.bool)], -1)
        bias = torch.cat([bias, torch.zeros(N, H, L, 1, dtype=torch.float64)], -1)

    if module.bias_k is not None:
        extra_key(module.bias_k.detach().cpu().to(td).expand(N, 1, E),
                  module.bias_v.detach().cpu().to(td).expand(N, 1, E))
    if module.add_zero_attn:
        extra_key(torch.zeros(N, 1, E, dtype=td), torch.zeros(N, 1, E, dtype=td))

    def heads(x: Any) -> np.ndarray:
        return _np(x.reshape(N, x.shape[1], H, hd).transpose(1, 2))

    qh, kh, vh = heads(q), heads(k), heads(v)
    s = 1.0 / math.sqrt(hd) if scale is None else scale
    b = bias.numpy() if bool((bias != 0).any()) else None
    kp = keep.numpy() if allowed is None else np.broadcast_to(allowed, keep.shape)
    if dtype == "float64":
        o = reference_attention(qh, kh, vh, mask=kp, bias=b, scale=s).out
    else:
        o = Baseline("torch", dtype).attention(qh, kh, vh, kp, s, bias=b)["out"]
    merged = torch.from_numpy(o).transpose(1, 2).reshape(N, L, E).to(td)
    wo = module.out_proj.weight.detach().cpu().to(td)
    bo = module.out_proj.bias
    out = F.linear(merged, wo, None if bo is None else bo.detach().cpu().to(td))
    return _np(out), kp


def judge_mha(call: Any) -> Judged:
    """Judge one ``nn.MultiheadAttention`` call (see :func:`mha_reference`)."""
    import torch

    a, m = call.arguments, call.module
    dtype = str(a["query"].dtype).replace("torch.", "")
    out = call.output
    q = _batch_first(m, a["query"])
    want = (q.shape[0], q.shape[1], m.embed_dim)
    got = None
    if isinstance(out, torch.Tensor):
        got = _batch_first(m, out.detach().cpu())
    if got is None or tuple(got.shape) != want:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Judged("shape", T("any.mha-shape", shape=shape,
                                 query=tuple(a["query"].shape), want=want), "")
    kw = {n: a.get(n) for n in ("key_padding_mask", "attn_mask")}

    scale = 1.0 / math.sqrt(m.embed_dim // m.num_heads)
    ref0, keep4 = mha_reference(m, a["query"], a["key"], a["value"], scale=scale, **kw)
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def oracle(kp: Any, s: float) -> tuple[np.ndarray, np.ndarray]:
        """The module's forward on the keys ``kp`` ``(N, H, L, S')`` (None: its masks)."""
        s = scale if s is None else s
        key = (s, None if kp is None else np.ascontiguousarray(kp).tobytes())
        if key not in cache:
            ref = ref0 if key == (scale, None) else mha_reference(
                m, a["query"], a["key"], a["value"], scale=s, keep=kp, **kw)[0]
            base = mha_reference(m, a["query"], a["key"], a["value"], dtype=dtype, scale=s,
                                 keep=kp, **kw)[0]
            cache[key] = (ref, base)
        return cache[key]

    # (N, L, S'): a query row is judged when every head may attend some key (a head with
    # none gives NaN in torch's own module, and 0 in the oracle: not compared)
    keep = keep4.any(1) & keep4.any(-1).all(1)[..., None]
    g = _np(got)
    j = _rule(g, keep, lambda kp, s: oracle(None, s), scale)
    j.scale = scale
    if j.code is None:
        return j
    return _explain(j, call, g, keep, mha_readings(keep4, a, m, scale),
                    lambda kp, s: oracle(None, s), mha_fits(g, keep, oracle))


def mha_readings(keep4: np.ndarray, a: dict, m: Any, scale: float) -> list:
    """The other readings of an ``nn.MultiheadAttention`` call on its keys ``keep4``
    ``(N, H, L, S')``: the masks' parts (:func:`~..core.readings.mask_parts`), the masks
    read the other way round (the extra ``bias_k``/zero keys stay), another scale."""
    import torch

    S = keep4.shape[-1] - int(m.bias_k is not None) - int(m.add_zero_attn)
    extra = np.arange(keep4.shape[-1]) >= S  # the bias_k and zero keys: always attended

    def wide(x: Any) -> Any:  # a part of the S real keys, as (..., L, S') with extras False
        if x is None:
            return None
        x = np.broadcast_to(x, keep4.shape[:-1] + (S,))
        return np.concatenate([x, np.zeros(x.shape[:-1] + (len(extra) - S,), bool)], -1)

    masks = [a.get(n) for n in ("key_padding_mask", "attn_mask")]
    bool_mask = any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in masks)
    parts = mask_parts(keep4[..., :S])
    chain = mask_chain(
        keep4, polarity=polarity_reading(keep4 & ~extra) if bool_mask else None,
        later=wide(parts.later), padded=wide(parts.padded), outside=wide(parts.outside),
        window=parts.window,
        ignored=np.ones(keep4.shape[-2:], dtype=bool) if any(x is not None for x in masks)
        else None)
    hd = m.embed_dim // m.num_heads
    return chain + named_scales(hd, hd, scale)


def mha_fits(g: np.ndarray, keep: np.ndarray, oracle: Any) -> Any:
    """``fits(keep4, scale)`` of a reading of an MHA call: the output ``g`` ``(N, L, E)``
    within the rule of the forward on the keys ``keep4`` ``(N, H, L, S')``, on the rows
    judged (``keep`` ``(N, L, S')``) where every head has a key under the reading."""

    def fits(alt: Any, s: float | None) -> bool:
        rows = keep.any(-1)
        if alt is not None:
            rows = rows & np.asarray(alt).any(-1).all(1)
        if not rows.any():
            return False
        r2, b2 = oracle(alt, s)
        return rule_error(g[rows], r2[rows], b2[rows], 2.0, "alt") is None

    return fits
