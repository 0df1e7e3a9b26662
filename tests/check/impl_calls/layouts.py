"""Correct attention functions in conventions the checker must name, not call bugs (and a
few buggy twins), for tests/check/test_layouts.py. Each is a look-alike of a pattern,
written here: a key-padding mask (B, Tk), a per-key mask found by trying, heads on axis 2
as JAX and flash-attn lay them out, a function that is causal by itself.
"""

import numpy as np
import torch
import torch.nn.functional as F


def _softmax_ignoring(s, ignore):
    """Softmax over the last axis with ``ignore`` keys left out; a row with none left is 0."""
    s = np.where(ignore, -np.inf, s)
    m = s.max(-1, keepdims=True)
    e = np.where(ignore, 0.0, np.exp(s - np.where(np.isfinite(m), m, 0)))
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)


# -- a mask with one flag per key -------------------------------------------------------------
def attention_key_padding(q, k, v, key_padding_mask=None):
    """(B, H, T, D) inputs; key_padding_mask (B, Tk), True = a padded key to ignore."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    pad = np.zeros(s.shape, dtype=bool) if key_padding_mask is None \
        else key_padding_mask[:, None, None, :]
    return _softmax_ignoring(s, pad) @ v


def attention_key_padding_ignored(q, k, v, key_padding_mask=None):
    """Bug: takes the padding mask and never applies it."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax_ignoring(s, np.zeros(s.shape, dtype=bool)) @ v


def attention_key_padding_inverted(q, k, v, key_padding_mask=None):
    """Bug: named as a padding mask (True = ignore), it attends only the True keys."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    pad = np.zeros(s.shape, dtype=bool) if key_padding_mask is None \
        else ~key_padding_mask[:, None, None, :]
    return _softmax_ignoring(s, pad) @ v


def causal_top_left(q, k, v):
    """NumPy, a tril with no offset: query i sees keys j <= i (as SDPA's is_causal)."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax_ignoring(s, ~np.tril(np.ones(s.shape[-2:], dtype=bool))) @ v


def attention_token_mask(q, k, v, mask=None):
    """PyTorch, (B, T, D) inputs; mask (B, Tk) with True = a real token (may attend): a name
    that tells neither the layout nor the polarity."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def attention_padding_required(q, k, v, key_padding_mask):
    """The padding mask required, (B, H, T, D) inputs."""
    return attention_key_padding(q, k, v, key_padding_mask)


def attention_token_mask_required(q, k, v, mask):
    """A required mask (B, Tk), True = a real token, for (B, T, D) inputs: every call needs
    it, so the first call already has to find its layout."""
    return attention_token_mask(q, k, v, mask)


# -- heads on axis 2: (B, T, H, D) ------------------------------------------------------------
def dot_product_attention(query, key, value, bias=None, mask=None):
    """NumPy, JAX's layout: query (B, T, N, H), key/value (B, S, N, H); mask broadcastable
    to (B, N, T, S), True = may attend; returns (B, T, N, H)."""
    s = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(query.shape[-1])
    if bias is not None:
        s = s + bias
    ignore = np.zeros(s.shape, dtype=bool) if mask is None else ~np.broadcast_to(mask, s.shape)
    w = _softmax_ignoring(s, ignore).astype(query.dtype)
    return np.einsum("bnts,bsnh->btnh", w, value)


def dot_product_attention_unscaled(query, key, value, bias=None, mask=None):
    """Bug: the same layout, the scores never scaled."""
    s = np.einsum("btnh,bsnh->bnts", query, key)
    ignore = np.zeros(s.shape, dtype=bool) if mask is None else ~np.broadcast_to(mask, s.shape)
    return np.einsum("bnts,bsnh->btnh", _softmax_ignoring(s, ignore), value)


def flash_like(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
    """PyTorch, flash-attn's layout (B, T, H, D) in and out, through transposes."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        Tq, Tk = s.shape[-2:]
        allowed = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
        s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # a row with no key: 0
    return (w @ v).transpose(1, 2)


# -- causal by itself -------------------------------------------------------------------------
def sdpa_always_causal(q, k, v):
    """SDPA with is_causal=True written in: causal, aligned top-left."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def causal_bottom_right(q, k, v):
    """NumPy, a tril aligned bottom-right: query i sees keys j <= i + Tk - Tq."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax_ignoring(s, ~np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)) @ v


def causal_when_square(q, k, v):
    """Self-attention (Tq == Tk) causal, cross-attention (Tq != Tk) over every key: one
    function for both, as a decoder layer may share it."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    future = ~np.tril(np.ones((Tq, Tk), dtype=bool)) if Tq == Tk else np.zeros((Tq, Tk), bool)
    return _softmax_ignoring(s, future) @ v


def causal_bottom_right_unscaled(q, k, v):
    """Bug: causal as above, the scores never scaled."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2)
    return _softmax_ignoring(s, ~np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)) @ v
