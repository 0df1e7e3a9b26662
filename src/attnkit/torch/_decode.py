"""Decoding under a key mask: a few queries over many keys, without autograd.

The case of a padded batch generating one token at a time from tensors of its own (a
:class:`attnkit.torch.KVCache` keeps its buffers clean and takes the ``codes`` route
instead). The mask is the same for every query (padding, 1-D ``valid_lens``), so:

- the scores are ``(..., Tq, Tk)``, tiny next to K: they are masked by a select, which a
  NaN in a masked key cannot pass, so K is read once by the matmul and never copied;
- a NaN in a masked *value* row would still reach the output through ``0 * nan`` in
  ``w @ v``, so V is multiplied slab by slab, each slab of key rows first copied with its
  masked rows zeroed (:func:`attnkit.torch._nonfinite.zero_rows`' bitwise AND) into a
  buffer that stays in cache. Cleaning all of V at once would write a V-sized tensor to
  fresh memory, which on the CPU costs more than the attention (page faults); by slabs it
  costs one extra read of V from cache.

The scores are formed as ``(k @ q^T)^T`` once K outgrows the cache: a matrix-vector
product with the long axis first runs faster on the CPU's BLAS than ``q @ k^T``. Nothing
here reads a tensor back: the work is fixed by the shapes.
"""

from __future__ import annotations

import torch

from ._dtypes import stats_dtype
from ._keep import Keep
from ._nonfinite import bitmask, used_keys
from ._scores import group, ungroup

__all__ = ["DECODE_MAX_ROWS", "decode_path", "takes_decode"]

# At most this many query rows per key/value head (G * Tq) count as decoding.
DECODE_MAX_ROWS = 8
# Bytes per slab of cleaned V rows: small enough to stay in a CPU's L2/L3 cache.
SLAB_BYTES = 1 << 21
# From this many keys on, the scores are formed as (k @ q^T)^T.
KEYS_FIRST_FROM = 2048


def takes_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: Keep | None,
                 G: int, shape: tuple[int, ...]) -> bool:
    """Whether :func:`decode_path` serves a call with no bias, variant, dropout or
    weights: a key-only mask (shared by every query head of a group), few query rows per
    key/value head, and no autograd."""
    if keep is None or keep.keys is None or not keep.only_keys:
        return False
    if G * shape[-2] > DECODE_MAX_ROWS or q.ndim != k.ndim or 0 in shape:
        return False
    if keep.keys_differ_by_head(G):
        return False  # a per-query-head key mask would need folding per group
    return not (torch.is_grad_enabled()
                and (q.requires_grad or k.requires_grad or v.requires_grad))


def decode_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, G: int,
                shape: tuple[int, ...], keep: Keep, scale: float) -> torch.Tensor:
    """``out (..., H, Tq, Dv)`` for a call :func:`takes_decode` accepts."""
    dt = stats_dtype(q.dtype)
    Tq, Tk = shape[-2], shape[-1]
    qg = group(q, G).to(dt)  # (..., Hkv, G*Tq, Dk)
    kd = k.to(dt)
    s = (kd @ qg.mT).mT if Tk >= KEYS_FIRST_FROM else qg @ kd.mT
    allowed = keep.keys  # (..., 1|H, 1, Tk); with G > 1 its head axis is 1
    s = s.mul_(scale).masked_fill_(~allowed, float("-inf"))  # s: the matmul's own output
    w = torch.softmax(s, dim=-1)
    rows = keep.rows()  # a query with no key: softmax over -inf is NaN, its weights 0
    if rows is not None:
        w = w.masked_fill_(~rows, 0.0)  # w is our own buffer; a select stops NaN
    w = w.to(v.dtype)
    bits = bitmask(used_keys(keep, k, G), v.dtype)  # (..., Hkv|1, Tk, 1)
    vi = v.view(bits.dtype)
    per_key = max(1, v.numel() // Tk * v.element_size())
    step = max(16, SLAB_BYTES // per_key)
    if Tk <= step or torch.compiler.is_compiling():  # compiled, the AND fuses into a loop
        return ungroup(w @ vi.bitwise_and(bits).view(v.dtype), G, Tq)
    # One slab buffer for every slab: allocated once per call, it stays in cache.
    slab = torch.empty(v.shape[:-2] + (step, v.shape[-1]), dtype=bits.dtype,
                       device=v.device)
    out = torch.zeros(w.shape[:-1] + (v.shape[-1],), dtype=v.dtype, device=v.device)
    for j in range(0, Tk, step):
        n = min(step, Tk - j)
        part = torch.bitwise_and(vi[..., j:j + n, :], bits[..., j:j + n, :],
                                 out=slab[..., :n, :])
        out.add_(w[..., j:j + n] @ part.view(v.dtype))
    return ungroup(out, G, Tq)
