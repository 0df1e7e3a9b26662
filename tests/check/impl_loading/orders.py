"""Multi-head attention classes whose constructors take their arguments in the orders people
write them in: the checker must build each from the parameter names. Written for the tests
(look-alikes of common patterns, not copies)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def _attend(q, k, v, mask=None, dropout=None):
    """(B, H, Tq, D) attention; mask: True = may attend, broadcast to (B, H, Tq, Tk)."""
    s = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0).to(v.dtype)
    if dropout is not None:
        w = dropout(w)
    return w @ v


class HeadsFirst(nn.Module):
    """``(h, d_model, dropout=0.1)``: the head count comes first."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0, "d_model must be a multiple of h"
        self.h, self.d = h, d_model // h
        self.proj = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        B = query.shape[0]
        q, k, v = (p(x).view(B, -1, self.h, self.d).transpose(1, 2)
                   for p, x in zip(self.proj, (query, key, value)))
        if mask is not None:
            mask = mask.unsqueeze(1)  # (B, Tq, Tk) -> (B, 1, Tq, Tk); True = may attend
        out = _attend(q, k, v, mask, self.drop)
        return self.proj[3](out.transpose(1, 2).reshape(B, -1, self.h * self.d))


class WidthHeadsDropout(nn.Module):
    """``(d_model, num_heads, dropout)``: dropout required."""

    def __init__(self, d_model, num_heads, dropout):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout probability has to be in [0, 1), got {dropout}")
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)

    def forward(self, query, key, value):
        return self.attn(query, key, value, need_weights=False)[0]


class HeadsWidthKV(nn.Module):
    """``(n_head, d_model, d_k, d_v, dropout=0.1)``: per-head sizes given separately."""

    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_q = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_k = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_v = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, q, k, v):
        B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
        q = self.w_q(q).view(B, Tq, self.n_head, self.d_k).transpose(1, 2)
        k = self.w_k(k).view(B, Tk, self.n_head, self.d_k).transpose(1, 2)
        v = self.w_v(v).view(B, Tk, self.n_head, self.d_v).transpose(1, 2)
        out = _attend(q, k, v, None, self.drop)
        return self.fc(out.transpose(1, 2).reshape(B, Tq, -1))


class HiddenRateHeadSize(nn.Module):
    """``(hidden_size, dropout_rate, head_size)``: head_size is the size of one head."""

    def __init__(self, hidden_size, dropout_rate, head_size):
        super().__init__()
        if hidden_size % head_size:
            raise ValueError("hidden_size must be a multiple of head_size")
        self.heads, self.head_size = hidden_size // head_size, head_size
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.rate = dropout_rate

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_size), dim=-1)
        w = F.dropout(w, self.rate, training=self.training)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, E))


@dataclass
class TinyConfig:
    """A GPT-like config object: the module reads everything off it."""

    block_size: int = 256
    vocab_size: int = 100
    n_layer: int = 2
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.1
    bias: bool = True


class ConfigCausal(nn.Module):
    """``(config)``: causal self-attention built from a config object."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.register_buffer("causal", torch.tril(torch.ones(config.block_size,
                                                             config.block_size, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = _attend(q, k, v, self.causal[:T, :T])
        y = F.dropout(y, self.dropout, training=self.training)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class NeedsVocabulary(nn.Module):
    """A required parameter no name rule can fill: the checker must say how to write a
    factory instead."""

    def __init__(self, d_model, num_heads, tokenizer):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, batch_first=True)
        self.tokenizer = tokenizer

    def forward(self, query, key, value):
        return self.attn(query, key, value, need_weights=False)[0]


def make(E, H):
    """The factory form: ``make(E, H)`` builds a class whose own order differs."""
    return NeedsVocabulary(E, H, tokenizer=None)


class RaisesInInit(nn.Module):
    """A constructor that refuses every argument."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        raise RuntimeError("this module needs a GPU build")


class KeywordOnlyForward(nn.Module):
    """``forward(*, a, b, c)``: keyword-only inputs whose names do not say which is the
    query, the key and the value: it cannot be called."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, *, a, b, c):
        return self.attn(a, b, c, need_weights=False)[0]


class KeywordOnlyNamedForward(KeywordOnlyForward):
    """``forward(*, query, key, value)``: keyword-only, but the names say which is which."""

    def forward(self, *, query, key, value):
        return self.attn(query, key, value, need_weights=False)[0]


class RaisesOnEveryInput(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value):
        raise NotImplementedError("forward is left for the exercise")


class ConfigNaiveSoftmax(nn.Module):
    """``(config)``, with a softmax that forgets to subtract the row maximum."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(C // self.n_head))
        w = e / e.sum(-1, keepdim=True)
        return self.proj((w @ v).transpose(1, 2).reshape(B, T, C))


class PlainSettings:
    """A config class that is not a dataclass: its constructor names the fields."""

    def __init__(self, vocab_size=1000, hidden_size=768, num_attention_heads=12,
                 attention_probs_dropout_prob=0.1):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads = num_attention_heads
        self.attention_probs_dropout_prob = attention_probs_dropout_prob


class PlainConfigSelfAttention(nn.Module):
    """``(config)`` with a plain config class, called ``m(hidden_states)``."""

    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.drop = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states):
        B, T, E = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return (_attend(q, k, v, None, self.drop).transpose(1, 2).reshape(B, T, E),)
