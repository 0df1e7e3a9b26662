"""The plan of an attention call: which path runs it, decided from its structure alone.

:class:`Call` holds what decides the path (shapes, device, dtype, which arguments are
given; never what the tensors hold) and :func:`plan` is a pure, memoised function of it
(:func:`attnkit.torch.attention` runs what it returns).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal, NamedTuple

import torch

from ..spec import resolve_band

__all__ = ["Backend", "Call", "ONE_PASS_MAX_SCORES", "Plan", "may_pack", "plan"]

Backend = Literal["auto", "sdpa", "math", "triton"]
_BACKENDS = ("auto", "sdpa", "math", "triton")

# need_weights under autograd: above this many scores the output comes from the fused
# kernel, whose backward keeps O(T * D), and the weights are computed beside it (freed with
# the caller's reference); below it, one pass (its backward keeps the weights) is cheaper.
ONE_PASS_MAX_SCORES = 1 << 22

# SDPA gives a row with no allowed key output 0 and zero gradients from PyTorch 2.5 on
# (attnkit needs torch >= 2.13), so empty rows need nothing of their own on the SDPA path.


class Call(NamedTuple):
    """The structure of one call, which alone decides its path: shapes, device, dtype
    and which arguments are given (never what the tensors hold)."""

    backend: str
    device: str  # q.device.type
    triton: str | None  # why the Triton kernel cannot take the call (None: it can)
    q_shape: tuple[int, ...]
    Dv: int
    scores: tuple[int, ...]  # (..., H, Tq, Tk)
    masked: bool  # a mask or valid_lens
    bias: bool
    causal: str | None  # "bottom_right", "top_left" or None
    window: tuple[int | None, int | None] | None
    segment_ids: bool
    packed: bool  # segment_ids whose runs the packed path can take
    softcap: bool
    sinks: bool
    dropout: bool
    need_weights: bool
    grad: bool  # autograd records q, k or v (read only for need_weights)


class Plan(NamedTuple):
    """What :func:`plan` decides: the path, whether SDPA's own ``is_causal`` carries the
    band, whether the band (causal/window) must go into the mask, and whether a query
    may be left with no allowed key."""

    path: Literal["sdpa", "math", "triton", "packed"]
    is_causal: bool
    band: bool
    empty_rows: bool


@lru_cache(maxsize=4096)
def plan(call: Call) -> Plan:
    """The path for a call of this structure (memoised: a pure function of ``call``).
    ``ValueError`` when a forced backend cannot take the call, saying why."""
    Tq, Tk = call.scores[-2], call.scores[-1]
    left, right = resolve_band(call.causal, call.window, Tq, Tk)
    # Row i allows keys [d - left, d + right], d = i + Tk - Tq, within [0, Tk).
    band = not ((left is None or left >= Tk - 1) and (right is None or right >= Tq - 1))
    band_empties = band and not ((right is None or Tk - Tq + right >= 0)
                                 and (left is None or left >= 0)
                                 and (left is None or right is None or right >= -left))
    other = call.masked or call.bias or call.segment_ids
    empty_rows = other or band_empties or Tk == 0
    is_causal = band and not other and left is None and right == Tq - Tk
    mask_band = band and not is_causal

    if call.backend == "triton" and call.triton is not None:
        raise ValueError(f"backend='triton' cannot take this call: {call.triton}")
    if call.backend in ("auto", "triton") and call.triton is None and Tq and Tk:
        return Plan("triton", False, band, empty_rows)
    if call.backend == "sdpa" and call.softcap:
        raise ValueError("backend='sdpa' cannot take softcap (SDPA applies no score "
                         "function); use backend='math' or 'auto'")
    if call.packed:
        return Plan("packed", False, band, empty_rows)
    if call.backend == "math" or call.softcap or 0 in call.scores or 0 in call.q_shape \
            or not call.Dv:
        return Plan("math", False, band, empty_rows)  # empty sizes: zeros, in the graph
    if call.backend == "auto" and call.need_weights and (
            not call.grad or math.prod(call.scores) <= ONE_PASS_MAX_SCORES):
        return Plan("math", False, band, empty_rows)  # one pass: the weights are the buffer
    return Plan("sdpa", is_causal, mask_band, empty_rows)


def may_pack(call: Call) -> bool:
    """Whether the packed path could take the call, before its ids are read: CPU,
    ``segment_ids`` with no other mask or bias, more than one query (never a decoding
    step), not while ``torch.compile`` traces, no forced Triton."""
    return (call.segment_ids and call.device == "cpu" and not call.masked and not call.bias
            and call.scores[-2] > 1 and call.scores[-1] > 0 and call.backend != "triton"
            and not torch.compiler.is_compiling())
