"""A :class:`~attnkit.torch.MultiHeadAttention` decoding step over its KV cache, with the
checks that the layer and the cache make unnecessary left out.

A step's query, keys and values come from the layer's own projections and the cache's
own buffers, whose sizes :meth:`MultiHeadAttention.forward` has checked against the layer
(``_check_cache``): their structure is right by construction, and one new query under
bottom-right (or no) causal sees every cached key. What remains is SDPA over the
positions held with the cache's padding mask, and ``valid_lens`` if given. Anything
else (a mask, a bias, weights, a cross cache, CUDA's fused decoding kernel, dtypes that
differ) goes through :func:`attnkit.torch.attention`, which checks it.
"""

from __future__ import annotations

import torch
from torch import nn

from ._sdpa import sdpa_path
from ._signature import step_lengths_mask
from .cache import KVCache
from .functional import attention

__all__ = ["decode_step", "through_cache"]


def through_cache(
    cache: KVCache, k: torch.Tensor | None, v: torch.Tensor | None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append this call's k/v (every step of a self cache; a cross cache once) and
    return every cached position. Earlier positions are stored detached; when autograd
    records this call's k/v, those are attended live (one copy of the cache), so that
    their projections get a gradient."""
    if k is None or v is None:
        return cache.keys(), cache.values()  # a filled cross cache
    cache.append(k, v, valid)
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        past = cache.length - k.shape[2]
        return (torch.cat([cache.k[:, :, :past], k], dim=2),
                torch.cat([cache.v[:, :, :past], v], dim=2))
    return cache.keys(), cache.values()


def decode_step(
    m: nn.Module, x: torch.Tensor, cache: KVCache,
    valid_lens: torch.Tensor | None, causal: bool | str,
) -> torch.Tensor:
    """The self-attention of ``m`` (a :class:`~attnkit.torch.MultiHeadAttention`) for one
    new position ``x (B, 1, E)`` over ``cache``: project, append, attend over every
    position held, project out; ``(B, 1, E)``.

    The caller has checked ``x``, the cache's sizes, and that the call has nothing but
    (at most) ``valid_lens`` and a bottom-right or no ``causal``."""
    B = x.shape[0]
    H, Hkv, Dk, Dv = m.num_heads, m.num_kv_heads, m.head_dim, m.v_head_dim
    q = m.q_proj(x).view(B, 1, H, Dk).transpose(1, 2)  # (B, H, 1, Dk)
    k = m.k_proj(x).view(B, 1, Hkv, Dk).transpose(1, 2)
    v = m.v_proj(x).view(B, 1, Hkv, Dv).transpose(1, 2)
    k, v = through_cache(cache, k, v)  # (B, Hkv, Tk, D): every position held
    allowed = cache.padding_mask()  # (B, 1, 1, Tk) view of the cache's buffer, or None
    if q.dtype is not k.dtype or (valid_lens is not None and (
            type(valid_lens) is not torch.Tensor or valid_lens.shape != (B,))):
        # Not by construction (a cache of another dtype, lengths to check): checked.
        out, _ = attention(q, k, v, mask=allowed, valid_lens=valid_lens, causal=causal)
    else:
        try:
            if valid_lens is not None:
                lengths = step_lengths_mask(valid_lens, (B, 1, 1, 1), k.shape[2])
                allowed = lengths if allowed is None else allowed & lengths
            out = sdpa_path(q, k, v, G=H // Hkv, attn_mask=allowed, is_causal=False,
                            scale=None, dropout_p=0.0)
        except RuntimeError:  # e.g. lengths on another device: the checked path decides
            out, _ = attention(q, k, v, mask=cache.padding_mask(), valid_lens=valid_lens,
                               causal=causal)
    return m.out_proj(out.transpose(1, 2).reshape(B, 1, H * Dv))
