"""Multi-head attention modules written the way people write them, for
tests/check/test_calls.py (look-alikes of patterns, written here, not copied).

Every class is built as ``Class(embed_dim, num_heads)``.
"""

import math

import torch
from torch import nn


class _Heads(nn.Module):
    """Shared projections: (B, T, E) -> (B, H, T, D) and back."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.wq, self.wk = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.wv, self.wo = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)

    def split(self, x, w):
        B, T, _ = x.shape
        return w(x).view(B, T, self.h, self.d).transpose(1, 2)

    def attend(self, q, k, v, ignore=None):
        """ignore: bool, broadcastable to (B, H, Tq, Tk), True = ignore this key."""
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if ignore is not None:
            s = s.masked_fill(ignore, float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out = (w @ v).transpose(1, 2)
        return self.wo(out.reshape(out.shape[0], out.shape[1], -1))


class SelfAttentionWithMask(_Heads):
    """m(x, mask): self-attention; mask (B, T, T) or (T, T), True = may attend."""

    def forward(self, x, mask=None):
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        ignore = None
        if mask is not None:
            ignore = (mask == 0).unsqueeze(-3) if mask.dim() == 3 else mask == 0
        return self.attend(q, k, v, ignore)


class SelfAttentionInvertedMask(SelfAttentionWithMask):
    """Bug: documented as True = may attend, it ignores the True keys."""

    def forward(self, x, mask=None):
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        ignore = None
        if mask is not None:
            ignore = mask.bool().unsqueeze(-3) if mask.dim() == 3 else mask.bool()
        return self.attend(q, k, v, ignore)


class SelfAttentionReturnFlag(_Heads):
    """m(x, return_weights=False): a flag after x, no mask."""

    def forward(self, x, return_weights=False):
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        out = self.attend(q, k, v)
        return (out, None) if return_weights else out


class CausalSelfAttention(_Heads):
    """m(x), causal: a lower-triangular buffer masks the future."""

    def __init__(self, embed_dim, num_heads, block_size=64):
        super().__init__(embed_dim, num_heads)
        ones = torch.ones(block_size, block_size, dtype=torch.bool)
        self.register_buffer("tril", torch.tril(ones))

    def forward(self, x):
        T = x.shape[1]
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        return self.attend(q, k, v, ~self.tril[:T, :T])


class CausalMaskRemoved(CausalSelfAttention):
    """Bug: meant causal (it even keeps the buffer), the mask is never applied."""

    def forward(self, x):
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        return self.attend(q, k, v)


class BidirectionalSelfAttention(_Heads):
    """m(x), an encoder's self-attention: every position sees every other."""

    def forward(self, x):
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        return self.attend(q, k, v)


class SequenceFirst(_Heads):
    """Inputs (T, B, E), as nn.MultiheadAttention without batch_first, and no attribute
    that says so; attn_mask (Tq, Tk), True = masked."""

    def forward(self, query, key, value, attn_mask=None):
        q, k, v = (self.split(x.transpose(0, 1), w)
                   for x, w in ((query, self.wq), (key, self.wk), (value, self.wv)))
        return self.attend(q, k, v, attn_mask).transpose(0, 1)


class KeyPaddingOnly(_Heads):
    """Batch-first; key_padding_mask (B, Tk), True = ignore this key; nothing else."""

    def forward(self, query, key, value, key_padding_mask=None):
        q, k, v = (self.split(x, w)
                   for x, w in ((query, self.wq), (key, self.wk), (value, self.wv)))
        ignore = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        return self.attend(q, k, v, ignore)


class KeyPaddingIgnored(KeyPaddingOnly):
    """Bug: takes key_padding_mask and never applies it."""

    def forward(self, query, key, value, key_padding_mask=None):
        return super().forward(query, key, value)


class AdditiveSelfAttention(_Heads):
    """m(hidden_states, attention_mask): an additive float mask (B, 1, Tq, Tk), 0 where a
    key may be attended and a large negative number where not, added to the scores."""

    def forward(self, hidden_states, attention_mask=None):
        q, k, v = (self.split(hidden_states, w) for w in (self.wq, self.wk, self.wv))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if attention_mask is not None:
            s = s + attention_mask
        out = (torch.softmax(s, dim=-1) @ v).transpose(1, 2)
        return self.wo(out.reshape(out.shape[0], out.shape[1], -1))


class HeadFirstMask(_Heads):
    """A mask laid out (H, B, Tq, Tk): a layout no caller uses; the check cannot pass it."""

    def forward(self, query, key, value, mask):
        if mask.dim() != 4 or mask.shape[0] != self.h:
            raise ValueError(f"mask must be (H, B, Tq, Tk), got {tuple(mask.shape)}")
        q, k, v = (self.split(x, w)
                   for x, w in ((query, self.wq), (key, self.wk), (value, self.wv)))
        return self.attend(q, k, v, ~mask.transpose(0, 1))


class QKVByName(_Heads):
    """forward(value, key, query): the names, not the order, say which is which."""

    def forward(self, value, key, query, mask=None):
        q, k, v = (self.split(x, w)
                   for x, w in ((query, self.wq), (key, self.wk), (value, self.wv)))
        return self.attend(q, k, v, None if mask is None else ~mask)


class CausalWithKeepMask(_Heads):
    """m(x, mask): causal self-attention that also takes a mask, True = may attend."""

    def forward(self, x, mask=None):
        T = x.shape[1]
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if mask is not None:
            allowed = allowed & (mask.unsqueeze(-3) if mask.dim() == 3 else mask)
        return self.attend(q, k, v, ~allowed)


class CausalMaskArgumentIgnored(_Heads):
    """Bug: causal self-attention that takes a mask and never applies it."""

    def forward(self, x, mask=None):
        T = x.shape[1]
        q, k, v = (self.split(x, w) for w in (self.wq, self.wk, self.wv))
        return self.attend(q, k, v, ~torch.ones(T, T, dtype=torch.bool).tril())


class KeywordOnlySelfAttention(SelfAttentionWithMask):
    """forward(self, *, x, mask=None): nothing by position."""

    def forward(self, *, x, mask=None):
        return super().forward(x, mask=mask)


class KeywordOnlyCross(QKVByName):
    """forward(self, *, query, key, value, mask=None), mask True = may attend."""

    def forward(self, *, query, key, value, mask=None):
        return super().forward(value, key, query, mask=mask)


class TokenMask(_Heads):
    """forward(query, key, value, mask=None): mask (B, Tk), 1 for a real token, 0 for padding
    (as tutorials pass a tokenizer's attention mask)."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(x, w)
                   for x, w in ((query, self.wq), (key, self.wk), (value, self.wv)))
        if mask is not None:
            mask = mask.view(mask.shape[0], 1, 1, mask.shape[-1]) == 0
        return self.attend(q, k, v, mask)
