"""Hand-written multi-head attention modules: `factory(embed_dim, num_heads)` builds each.
`MultiHead` is right; each other class carries one bug that `attnkit check multi-head` names."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHead(nn.Module):
    """Correct: registered projections, -inf masking with an empty-row guard, nn.Dropout.
    forward(query, key, value, mask=None), mask bool (B, Tq, Tk), True = masked (the notes)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.w_q = nn.Linear(embed_dim, embed_dim)
        self.w_k = nn.Linear(embed_dim, embed_dim)
        self.w_v = nn.Linear(embed_dim, embed_dim)
        self.w_o = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)

    def split(self, x):  # (B, T, E) -> (B, H, T, D)
        return x.view(x.shape[0], -1, self.h, self.d).transpose(1, 2)

    def attend(self, q, k, v, mask):
        s = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1), float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0).to(v.dtype)  # no key: weights 0
        return self.dropout(w) @ v

    def forward(self, query, key, value, mask=None):
        q, k = self.split(self.w_q(query)), self.split(self.w_k(key))
        v = self.split(self.w_v(value))
        out = self.attend(q, k, v, mask)  # (B, H, Tq, D)
        out = out.transpose(1, 2).reshape(query.shape[0], -1, self.h * self.d)
        return self.w_o(out)


class PlainListProjections(MultiHead):
    """unregistered-parameter: the projections live in a plain list (seed 002)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        del self.w_q, self.w_k, self.w_v, self.w_o
        self.linears = [nn.Linear(embed_dim, embed_dim) for _ in range(4)]

    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split(lin(x)) for lin, x in zip(self.linears, (query, key, value)))
        out = self.attend(q, k, v, mask).transpose(1, 2)
        return self.linears[3](out.reshape(query.shape[0], -1, self.h * self.d))


class FillMinus1e9(MultiHead):
    """float16-overflow: masked_fill with -1e9 (seeds 000, 004): fails in float16, and a
    query with no allowed key averages the values (a fully-masked-row warning)."""

    def attend(self, q, k, v, mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1), -1e9)
        return self.dropout(torch.softmax(s, dim=-1)) @ v


class FunctionalDropout(MultiHead):
    """dropout-in-eval: F.dropout without training=self.training."""

    def __init__(self, embed_dim, num_heads, dropout_p=0.1):
        super().__init__(embed_dim, num_heads)
        self.dropout_p = dropout_p

    def attend(self, q, k, v, mask):
        s = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1), float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0).to(v.dtype)
        return F.dropout(w, self.dropout_p) @ v


class UnusedGate(MultiHead):
    """no-gradient: a registered parameter that forward never uses."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.gate = nn.Parameter(torch.ones(embed_dim))


class PlainTensorBias(MultiHead):
    """state-dict: a random tensor kept as a plain attribute is not saved."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        self.head_bias = torch.randn(num_heads, 1, 1)

    def attend(self, q, k, v, mask):
        return super().attend(q, k, v, mask) + self.head_bias
