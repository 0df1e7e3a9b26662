"""Typical wrong answers to the exercises of chapter 1, each with the finding that names it."""

from __future__ import annotations

import numpy as np
import torch


def softmax_naive(x):
    """No max subtraction: exp(1000) is inf, and inf / inf is NaN."""
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_in_place(x):
    """The max subtracted in place: the caller's array changes."""
    x -= x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_axis_0(x):
    """Normalised over the first axis."""
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def softmax_sum_without_keepdims(x):
    """``e.sum(axis=-1)`` without keepdims broadcasts against the wrong axis (or fails)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1)


def logsumexp_naive(x):
    """log(sum(exp(x))) as it reads: log(0) = -inf once every exp underflows."""
    return np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logsumexp_without_max_back(x):
    """The shift by m applied but m never added back."""
    m = x.max(axis=-1, keepdims=True)
    return np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def logsumexp_no_keepdims(x):
    """The last axis dropped: ``x - lse`` no longer lines up row by row."""
    m = x.max(axis=-1)
    return m + np.log(np.exp(x - m[..., None]).sum(axis=-1))


def softmax_torch_in_place(x):
    """``sub_`` on the caller's tensor."""
    x = x.float() if x.dtype != torch.float32 else x
    e = torch.exp(x.sub_(x.amax(dim=-1, keepdim=True)))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_torch_via_numpy(x):
    """A detour through NumPy: right numbers, but autograd loses track."""
    a = x.detach().float().numpy()
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=-1, keepdims=True)).to(x.dtype)


def softmax_torch_naive(x):
    """No max subtraction, in float32: exp overflows at logits ~1e3."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)



def softmax_global_max(x):
    """The maximum of the whole array, not of each row: a row far below the largest
    logit underflows to 0 / 0."""
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)


WRONG = [
    ("softmax", softmax_naive, "nan-or-inf"),
    ("softmax", softmax_in_place, "mutates-input"),
    ("softmax", softmax_axis_0, "inaccurate"),
    ("softmax", softmax_sum_without_keepdims, "shape"),
    ("logsumexp", logsumexp_naive, "nan-or-inf"),
    ("logsumexp", logsumexp_without_max_back, "nan-or-inf"),
    ("logsumexp", logsumexp_no_keepdims, "shape"),
    ("softmax_torch", softmax_torch_in_place, "mutates-input"),
    ("softmax_torch", softmax_torch_via_numpy, "gradient"),
    ("softmax_torch", softmax_torch_naive, "nan-or-inf"),
    ("softmax", softmax_global_max, "nan-or-inf"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report): the line to change.
DIAGNOSIS = {
    "softmax_naive": r"max",
    "softmax_in_place": r"in-place|copy",
    "softmax_axis_0": r"axis",
    "softmax_sum_without_keepdims": r"keepdims",
    "softmax_global_max": r"each row|per row|axis=-1|keepdims",
    "logsumexp_naive": r"max",
    "logsumexp_without_max_back": r"add.*back|\+ m\b|m \+",
    "logsumexp_no_keepdims": r"keepdims",
    "softmax_torch_in_place": r"in-place|sub_|out-of-place",
    "softmax_torch_via_numpy": r"NumPy|autograd",
    "softmax_torch_naive": r"max",
}
