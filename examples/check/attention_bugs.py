"""Hand-written attention functions, each with one bug that `attnkit check` names.

The bugs are the ones of the notes attnkit grew from (docs/check.md shows each report and
the fix; tests/check/ asserts each is flagged with its code and no other error).
"""

import math

import numpy as np
import torch


def attention_naive_softmax(q, k, v):
    """nan-or-inf: a softmax without the max trick (seed 001) overflows at logits ~1000."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s)
    return (e / e.sum(-1, keepdims=True)) @ v


def attention_fill_1e9(q, k, v, mask):
    """float16-overflow: -1e9 does not fit in float16 (seeds 000, 004). mask: True = masked."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(mask, -1e9)
    return torch.softmax(s, dim=-1) @ v


def attention_scale_in_place(q, k, v):
    """mutates-input: q.mul_ scales the caller's tensor (seed 000)."""
    q.mul_(q.shape[-1] ** -0.5)
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def attention_unscaled(q, k, v):
    """wrong-scale: no 1/sqrt(Dk)."""
    s = q @ np.swapaxes(k, -1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def attention_mask_true_is_masked(q, k, v, mask):
    """mask-polarity when declared 'keep' (True = may attend): this one masks where True."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key gives 0
    return w @ v


def attention_top_left(q, k, v, attn_mask=None, is_causal=False):
    """causal-alignment (a warning): is_causal keeps j <= i even when Tq != Tk."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def attention_reshaped_like_q(q, k, v):
    """shape: the output is reshaped to q's shape, wrong when Dv != Dk."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, dim=-1) @ v).reshape(q.shape)  # fine while Tq == Tk, Dv == Dk


class _Unscaled_dq(torch.autograd.Function):
    """A hand-written backward that forgets the scale in dq."""

    @staticmethod
    def forward(ctx, q, k, v):
        scale = q.shape[-1] ** -0.5
        w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        ctx.save_for_backward(q, k, v, w)
        return w @ v

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, w = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        dv = w.transpose(-2, -1) @ d_out
        dp = d_out @ v.transpose(-2, -1)
        ds = w * (dp - (w * dp).sum(-1, keepdim=True))
        dq = ds @ k  # the bug: no * scale
        dk = ds.transpose(-2, -1) @ q * scale
        return dq, dk, dv


def attention_custom_backward(q, k, v):
    """gradient: the forward is right, the hand-written backward is not."""
    return _Unscaled_dq.apply(q, k, v)


def attention_half_scores(q, k, v):
    """inaccurate: the scores are computed in float16, whatever the input dtype."""
    s = (q.astype(np.float16) @ np.swapaxes(k, -1, -2).astype(np.float16)).astype(q.dtype)
    s = s / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v
