"""attnkit.numpy: the readable reference implementation and the oracle of every backend.

NumPy only (no torch import). Every op computes in float64 for float64 input, and in
float32 for float32/float16 input. Every op also has a hand-written backward, reached
through :func:`vjp`; :mod:`attnkit.numpy.optim` has SGD and Adam for NumPy parameters.
"""

from __future__ import annotations

from . import optim
from .additive import additive_attention
from .attention import scaled_dot_product_attention
from .flash import flash_attention, merge_partials
from .masks import (
    attention_mask,
    causal_mask,
    masked_softmax,
    segment_ids_from_cu_seqlens,
    segment_ids_from_lengths,
    segment_ids_from_padding_mask,
    segment_mask,
    sequence_mask,
    window_mask,
)
from .mha import MultiHeadParams, multi_head_attention
from .softmax import log_softmax, logsumexp, softmax
from .vjp import Grads, check_vjp, vjp

__all__ = [
    "Grads",
    "MultiHeadParams",
    "additive_attention",
    "attention_mask",
    "causal_mask",
    "check_vjp",
    "flash_attention",
    "log_softmax",
    "logsumexp",
    "masked_softmax",
    "merge_partials",
    "multi_head_attention",
    "optim",
    "scaled_dot_product_attention",
    "segment_ids_from_cu_seqlens",
    "segment_ids_from_lengths",
    "segment_ids_from_padding_mask",
    "segment_mask",
    "sequence_mask",
    "softmax",
    "vjp",
    "window_mask",
]
