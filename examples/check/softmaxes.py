"""Hand-written softmaxes, one bug each (see docs/check.md)."""

import numpy as np
import torch


def softmax_naive(x):
    """Seed 001: no max trick, so exp() overflows at logits near 1000."""
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def softmax(x):
    """The fix: subtract the row maximum first."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_torch(x):
    return torch.softmax(x, dim=-1)
