"""A look-alike written for these tests: a hand-written attention that fills padded scores
with -1e9 in the model's own dtype (fine in float32, raises in float16)."""

from __future__ import annotations

import math

import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x, pad):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(C // self.heads)
        s = s.masked_fill(pad[:, None, None, :], -1e9)
        return self.out((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.attn = nn.Embedding(32, 16), Attn()

    def forward(self, ids, pad):
        x = self.embed(ids)
        return x + self.attn(x, pad)


def build():
    torch.manual_seed(0)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    return Model(), (torch.randint(0, 32, (2, 6)), pad)
