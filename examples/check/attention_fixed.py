"""Correct hand-written attention, one per calling convention: `attnkit check` finds no error."""

import math

import numpy as np
import torch


def attention(q, k, v):
    """NumPy, no mask: max-subtracted softmax, 1/sqrt(Dk)."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def attention_masked(q, k, v, mask=None):
    """NumPy, mask True = masked out (the notes' convention); returns (out, weights)."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, -np.inf, s)  # -inf, not -1e9: nothing masked enters the softmax
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))  # a row with no key: exp(-inf) = 0
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return w @ v, w


def attention_keep(q, k, v, mask=None):
    """PyTorch, mask True = may attend (JAX, attnkit); statistics in float32."""
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key gives 0, not NaN
    return w.to(v.dtype) @ v


def attention_valid_lens(queries, keys, values, valid_lens=None):
    """PyTorch, d2l's valid_lens (B,): keys j < valid_lens[b] count."""
    s = (queries @ keys.transpose(-2, -1)).float() / math.sqrt(queries.shape[-1])
    if valid_lens is not None:
        j = torch.arange(keys.shape[-2])
        keep = j < valid_lens.reshape(-1, *([1] * (s.dim() - 1)))
        s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w.to(values.dtype) @ values


def attention_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """PyTorch, SDPA's signature; is_causal bottom-right aligned (as attnkit)."""
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    if is_causal:
        attn_mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w.to(v.dtype) @ v


def attention_d2l(queries, keys, values, valid_lens=None):
    """PyTorch, d2l's DotProductAttention as a function: (B, T, D) only (torch.bmm), with
    a masked softmax that neither writes into the scores nor fills with -1e6."""
    scores = torch.bmm(queries, keys.transpose(1, 2)).float() / math.sqrt(queries.shape[-1])
    if valid_lens is not None:
        keep = torch.arange(keys.shape[1]) < valid_lens[:, None, None]
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(values.dtype)
    return torch.bmm(weights, values)
