"""Solutions to the exercises of chapter 1, "Softmax and its numerics"."""

from __future__ import annotations

import numpy as np
import torch


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of ``x`` (any shape, any float dtype), without overflow.

    Subtracting the row maximum changes nothing mathematically, and afterwards the largest
    exponent is ``exp(0) = 1``. The result is a new array: ``x`` is not changed.
    """
    shifted = x - x.max(axis=-1, keepdims=True)     # a new array, not x -= ...
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def logsumexp(x: np.ndarray) -> np.ndarray:
    """``log(sum(exp(x)))`` over the last axis, kept as a length-1 axis: ``(..., 1)``.

    ``m + log(sum(exp(x - m)))`` with ``m`` the row maximum: the sum is at least 1, so the
    log never sees 0 (underflow) and exp never overflows.
    """
    m = x.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis of a tensor, differentiable, half precision included.

    The arithmetic runs in float32 (float16's largest number is 65504) and the result comes
    back in ``x``'s dtype. Only out-of-place ops, so autograd sees every step and the
    caller's ``x`` is unchanged.
    """
    x32 = x.float()
    e = torch.exp(x32 - x32.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
