"""Look-alikes of code the checker met in the wild and got wrong (issue 37, part 3), for
tests/check/test_real_patterns.py. Each is written here from the pattern, not copied.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


# -- 1. self-attention by default, cross-attention when key/value are given -------------------
class SelfOrCross(nn.Module):
    """forward(query, key=None, value=None, mask=None): correct, mask True = may attend."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.q, self.k = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.v, self.o = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)

    def _split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.d).transpose(1, 2)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = self._split(self.q(query)), self._split(self.k(key)), self._split(self.v(value))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.nan_to_num(torch.softmax(s, -1))  # a query with no allowed key: 0
        out = (w @ v).transpose(1, 2).reshape(query.shape)
        return self.o(out)


class SelfOrCrossNoMask(SelfOrCross):
    """forward(query, key=None, value=None): no mask at all."""

    def forward(self, query, key=None, value=None):
        return super().forward(query, key, value)


class SelfOrCrossQueryLength(SelfOrCross):
    """Cross-attention broken: the keys are split with the query's length."""

    def forward(self, query, key=None, value=None):
        key = query if key is None else key
        value = key if value is None else value
        b, t, e = query.shape
        q = self._split(self.q(query))
        k = self.k(key).reshape(b, t, self.h, self.d).transpose(1, 2)
        v = self.v(value).reshape(b, t, self.h, self.d).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d), -1)
        return self.o((w @ v).transpose(1, 2).reshape(b, t, e))


# -- 2. a softmax whose axis is required ------------------------------------------------------
def softmax_dim_required(x, dim):
    x = x - x.max(dim=dim, keepdim=True).values
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_dim_required_naive(x, dim):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


# -- 3. the max of the whole array ----------------------------------------------------------
def softmax_global_max(x):
    e = np.exp(x - x.max())
    return e / e.sum(-1, keepdims=True)


# -- 4. an unguarded default mask ---------------------------------------------------------
def attention_unguarded_mask(q, k, v, mask=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(mask == 0, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1)) @ v


def attention_unguarded_mask_unscaled(q, k, v, mask=None):
    s = q @ k.transpose(-1, -2)
    s = s.masked_fill(mask == 0, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1)) @ v


# -- 5. one sequence, one head -------------------------------------------------------------
def softmax_2d(x):
    e = np.exp(x - x.max(axis=1).reshape(-1, 1))
    return e / e.sum(axis=1).reshape(-1, 1)


def attention_2d(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    w = np.exp(s - s.max(axis=1).reshape(-1, 1))
    w = w / w.sum(axis=1).reshape(-1, 1)
    return w @ v


def attention_2d_unscaled(q, k, v):
    s = q @ k.T
    w = np.exp(s - s.max(axis=1).reshape(-1, 1))
    w = w / w.sum(axis=1).reshape(-1, 1)
    return w @ v


# -- 6. a mask applied by multiplication ------------------------------------------------------
def masked_softmax_multiply(x, mask):
    """mask True = may attend: masked logits become 0, then the weights renormalised."""
    m = mask.astype(x.dtype)
    z = x * m
    e = np.exp(z - z.max(-1, keepdims=True)) * m
    s = e.sum(-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1), 0.0)


# -- 7. a mask that only switches behaviour; True = masked as nn.MultiheadAttention ----------
def attention_mask_switch(q, k, v, mask=None):
    """Any mask makes it causal (its own tril): the mask's values are never read."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        tq, tk = s.shape[-2], s.shape[-1]
        causal = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
        s = s.masked_fill(~causal, float("-inf"))
    return torch.softmax(s, -1) @ v


def attention_true_is_masked(q, k, v, attn_mask=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        s = s.masked_fill(attn_mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1)) @ v


class SwitchCausal(SelfOrCross):
    """forward(x, mask=None): any mask makes it causal."""

    def forward(self, x, mask=None):
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril() if mask is not None else None
        return super().forward(x, x, x, causal)


# -- 8. masks paired with the wrong examples --------------------------------------------------
class PaddingRepeatMixed(nn.Module):
    """forward(x, key_padding_mask=None), True = padding; the mask is repeated head-major
    while the scores are batch-major, so example b gets another example's mask."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.o = nn.Linear(embed_dim, embed_dim)
        self.batch_first = True

    def forward(self, x, key_padding_mask=None, mixed=True):
        b, t, e = x.shape
        q, k, v = self.qkv(x).chunk(3, -1)
        q, k, v = (z.view(b, t, self.h, self.d).transpose(1, 2).reshape(b * self.h, t, self.d)
                   for z in (q, k, v))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if key_padding_mask is not None:
            if mixed:
                pad = key_padding_mask.repeat(self.h, 1)[:, None, :]
            else:
                pad = key_padding_mask.repeat_interleave(self.h, 0)[:, None, :]
            s = s.masked_fill(pad, float("-inf"))
        w = torch.nan_to_num(torch.softmax(s, -1))
        out = (w @ v).view(b, self.h, t, self.d).transpose(1, 2).reshape(b, t, e)
        return self.o(out)


class PaddingRepeatRight(PaddingRepeatMixed):
    def forward(self, x, key_padding_mask=None):
        return super().forward(x, key_padding_mask, mixed=False)


# -- 10. float16 overflow causes ---------------------------------------------------------
def attention_fill_constant(q, k, v, mask):
    """mask True = may attend, filled with a constant that float16 cannot hold."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, -1e30)
    return torch.softmax(s, -1) @ v


def _fill_value(dtype):
    return {torch.float32: -1e9, torch.float64: -1e9, torch.float16: -6e4}[dtype]


def attention_dtype_helper(q, k, v, mask):
    """A dtype helper with no entry for bfloat16."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, _fill_value(s.dtype))
    return torch.nan_to_num(torch.softmax(s, -1)) @ v


class Float32Buffer(SelfOrCross):
    """A plain float32 tensor attribute (not a buffer): .half() leaves it float32."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.temperature = torch.ones(1)

    def forward(self, x):
        b, t, e = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        s = q @ k.transpose(-1, -2) / (math.sqrt(self.d) * self.temperature)
        w = torch.softmax(s, -1)
        return self.o((w @ v).transpose(1, 2).reshape(b, t, e))


class Float32Table(SelfOrCross):
    """Rotary tables made in forward with no dtype=: float32, whatever the inputs are; in
    float16, q and k become float32 and SDPA refuses them with the float16 v."""

    def forward(self, x):
        b, t, e = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        inv = 1.0 / 10000 ** (torch.arange(0, self.d, 2) / self.d)
        angles = torch.outer(torch.arange(t), inv)
        cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

        def rotate(z):
            half = z.shape[-1] // 2
            return z * cos + torch.cat([-z[..., half:], z[..., :half]], -1) * sin

        y = torch.nn.functional.scaled_dot_product_attention(rotate(q), rotate(k), v)
        return self.o(y.transpose(1, 2).reshape(b, t, e))


# -- 11. a class built from a config; a seq-first module asserting its mask layout ----------
@dataclass
class TinyConfig:
    hidden: int
    heads: int
    rope_style: str


class FromConfig(SelfOrCross):
    def __init__(self, config):
        if config.rope_style not in ("none", "neox"):
            raise ValueError(f"unknown rope_style {config.rope_style!r}")
        super().__init__(config.hidden, config.heads)

    def forward(self, x):
        return super().forward(x)


@dataclass
class BadConfig:
    hidden: int
    heads: int
    rope_style: str = "rotary"


class FromBadConfig(SelfOrCross):
    def __init__(self, config: BadConfig):
        if config.rope_style not in ("none", "neox"):
            raise ValueError(f"unknown rope_style {config.rope_style!r}")
        super().__init__(config.hidden, config.heads)


class AssertsFloatPadding(SelfOrCross):
    """A padding mask it asserts to be additive (float), named as a bool one."""

    def forward(self, x, key_padding_mask):
        assert key_padding_mask.is_floating_point()
        keep = (key_padding_mask == 0)[:, None, None, :]
        return super().forward(x, x, x, keep)


class SeqFirstAsserting(SelfOrCross):
    """(T, B, E) inputs, a (B, T) padding mask it asserts, True = padding."""

    def forward(self, x, src_key_padding_mask):
        assert src_key_padding_mask.dim() == 2 and src_key_padding_mask.shape[0] == x.shape[1]
        assert src_key_padding_mask.dtype == torch.bool
        y = x.transpose(0, 1)
        keep = ~src_key_padding_mask[:, None, None, :]
        return super().forward(y, y, y, keep).transpose(0, 1)


# -- 12. a torch function that stops for its own reason --------------------------------------
def attention_cuda_only(q, k, v):
    """A kernel wrapper that refuses CPU tensors (NumPy arrays fail earlier, on .is_cuda)."""
    if not q.is_cuda:
        raise RuntimeError("this kernel runs on CUDA tensors only")
    return F.scaled_dot_product_attention(q, k, v)


class AttnMaskTrueIsMasked(SelfOrCross):
    """forward(x, attn_mask=None) with nn.MultiheadAttention's convention: True = masked."""

    def forward(self, x, attn_mask=None):
        return super().forward(x, x, x, None if attn_mask is None else ~attn_mask)


# -- 9. a shape error on every layout -------------------------------------------------------
def softmax_no_keepdims(x):
    e = np.exp(x - x.max(-1))
    return e / e.sum(-1)


def attention_global_max(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max())
    return (w / w.sum(-1, keepdims=True)) @ v


class CudaOnly(SelfOrCross):
    """A module whose forward refuses CPU tensors (a kernel wrapper)."""

    def forward(self, x):
        if not x.is_cuda:
            raise RuntimeError("this kernel runs on CUDA tensors only")
        return super().forward(x)
