"""Attention as a class, an instance, a bound method, with dropout left on, and a file that
prints: the ways people hand their code to the checker. Written for the tests."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

print("importing targets.py: hello from the user's file")  # must not reach --json's stdout


class ScaledDot(nn.Module):
    """A parameterless attention module: ``ScaledDot(dropout)``, called ``m(q, k, v)``."""

    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values):
        s = queries @ keys.transpose(-2, -1) / math.sqrt(queries.shape[-1])
        return self.dropout(torch.softmax(s, dim=-1)) @ values


class Unscaled(nn.Module):
    """Forgets 1/sqrt(d)."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


class NeedsTemperature(nn.Module):
    """A required argument the checker cannot choose (the scale)."""

    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / self.temperature, dim=-1) @ v


scaled = ScaledDot(0.0)
unscaled = Unscaled()
in_train_mode = ScaledDot(0.3)  # never put in eval(): its dropout is on


def attention_always_dropout(q, k, v):
    """F.dropout's training defaults to True: the dropout is on in every call."""
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return F.dropout(w, 0.1) @ v


def attention_printing(q, k, v):
    print("attention called with", tuple(q.shape))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def attention_printing_unscaled(q, k, v):
    print("attention called with", tuple(q.shape))
    s = q @ np.swapaxes(k, -1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def attention_raises(q, k, v):
    raise NotImplementedError("TODO: write attention")


class HardDropoutInEval(nn.Module):
    """``F.dropout(w, 0.1, training=True)``: a probability no knob reaches, on in eval()."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, E // self.h).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(E // self.h), dim=-1)
        w = F.dropout(w, 0.1, training=True)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, E))


def softmax_writes_to_fd1(x):
    """Writes to file descriptor 1 directly (as C code or a child process would)."""
    import os

    os.write(1, b"written to fd 1\n")
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)
