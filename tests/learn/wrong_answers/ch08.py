"""Typical wrong answers to the exercises of chapter 8, each with the finding that names it."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _weights(q, k, mask):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def attention_with_weights_scores(q, k, v, mask):
    """The right output, but the scores returned as "weights"."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _weights(q, k, mask) @ v, scores


def attention_with_weights_unmasked(q, k, v, mask):
    """The right output, but weights from a second softmax that forgot the mask."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return _weights(q, k, mask) @ v, e / e.sum(axis=-1, keepdims=True)


def attention_with_weights_minus_1e9(q, k, v, mask):
    """A -1e9 fill: a query with no key averages every value, with uniform weights."""
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -1e9)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    w = e / e.sum(axis=-1, keepdims=True)
    return w @ v, w


class _Looking(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def drop(self, weights):
        raise NotImplementedError

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        out = self.out_proj((self.drop(weights) @ v).transpose(1, 2).reshape(B, T, E))
        return out, weights


class LookingFunctionalDropout(_Looking):
    """``F.dropout(w, p)``: its ``training`` argument defaults to True, eval() or not."""

    def drop(self, weights):
        return F.dropout(weights, self.dropout)


class LookingDropoutMadeInForward(_Looking):
    """A fresh ``nn.Dropout`` built inside forward is always in training mode."""

    def drop(self, weights):
        return nn.Dropout(self.dropout)(weights)



class LookingAlwaysTraining(_Looking):
    """``training=True`` written out: the weights are dropped after eval() too."""

    def drop(self, weights):
        return F.dropout(weights, self.dropout, training=True)


WRONG = [
    ("attention_with_weights", attention_with_weights_scores, "inaccurate"),
    ("attention_with_weights", attention_with_weights_unmasked, "inaccurate"),
    ("attention_with_weights", attention_with_weights_minus_1e9, "fully-masked-row"),
    ("LookingAttention", LookingFunctionalDropout, "dropout-in-eval"),
    ("LookingAttention", LookingDropoutMadeInForward, "dropout-in-eval"),
    ("LookingAttention", LookingAlwaysTraining, "dropout-in-eval"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report, where words that are not code have their Chinese
# after a |): the line to change.
DIAGNOSIS = {
    "attention_with_weights_scores": r"weights",
    "attention_with_weights_unmasked": r"mask",
    "attention_with_weights_minus_1e9": r"fill|替换",
    "LookingFunctionalDropout": r"training=self\.training|nn\.Dropout",
    "LookingDropoutMadeInForward": r"training=self\.training|nn\.Dropout",
    "LookingAlwaysTraining": r"training=self\.training|nn\.Dropout",
}
