"""Modules that keep the attention weights of the last forward on ``self`` (for plotting),
as tutorial code often does: the weights are a tensor forward produced, not a parameter."""

from __future__ import annotations

import math

import torch
from torch import nn


class CachedFill1e9(nn.Module):
    """``self.attn = p_attn``, and masked scores filled with -1e9: -1e9 does not fit in
    float16, so a half copy fails."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(p=dropout)
        self.attn = None

    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        q, k, v = (lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        self.attn = self.dropout(scores.softmax(dim=-1))
        x = (self.attn @ v).transpose(1, 2).contiguous().view(B, -1, self.h * self.d_k)
        return self.linears[-1](x)


class CachedFixed(nn.Module):
    """The same, with the fill that fits every dtype and the empty row guarded."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(p=dropout)
        self.attn = None

    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        q, k, v = (lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value)))
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, float("-inf"))
        w = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(v.dtype)
        self.attn = self.dropout(w)
        x = (self.attn @ v).transpose(1, 2).contiguous().view(B, -1, self.h * self.d_k)
        return self.linears[-1](x)


class CachedWeightsList(nn.Module):
    """``self.attention_weights = ...`` kept in a list of per-call tensors."""

    def __init__(self, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.attention_weights = []

    def forward(self, queries, keys, values):
        B, Tq, E = queries.shape
        H, D = self.num_heads, E // self.num_heads

        def split(x):
            return x.reshape(B, x.shape[1], H, D).transpose(1, 2)

        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1)
        self.attention_weights = [w]
        out = (self.drop(w) @ v).transpose(1, 2).reshape(B, Tq, E)
        return self.W_o(out)


layer = CachedFill1e9(4, 16, dropout=0.0)  # an instance, ready to check


class LazyValidLens(nn.Module):
    """d2l-like: lazy projections (their shapes come from the first call), ``valid_lens``,
    and the weights of the last call kept on ``self``; the fill fits every dtype."""

    def __init__(self, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.LazyLinear(num_hiddens, bias=bias)
                                                  for _ in range(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        B, Tq, _ = queries.shape
        Tk = keys.shape[1]
        q, k, v = (w(x).reshape(B, x.shape[1], self.num_heads, -1).transpose(1, 2)
                   for w, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values)))
        s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        if valid_lens is not None:
            keep = torch.arange(Tk) < valid_lens[:, None, None, None]
            s = s.masked_fill(~keep, float("-inf"))
        self.attention_weights = torch.softmax(s, dim=-1).nan_to_num(0.0).to(v.dtype)
        out = (self.drop(self.attention_weights) @ v).transpose(1, 2).reshape(B, Tq, -1)
        return self.W_o(out)


class HoldsLock(CachedFixed):
    """Keeps a lock on ``self``: the instance cannot be deep-copied."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__(h, d_model, dropout)
        import threading

        self.lock = threading.Lock()


locked = HoldsLock(4, 16, dropout=0.0)
