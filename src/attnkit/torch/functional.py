"""Functional attention for PyTorch: one entry point, three interchangeable paths.

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

:func:`attention` computes ``softmax(q k^T * scale + bias, masked) v`` with the semantics of
:mod:`attnkit.numpy` (its float64 oracle): masks say True = may attend, ``causal`` and
``window`` are bottom-right aligned (``causal="top_left"`` is SDPA's ``is_causal``),
``valid_lens`` follows d2l, ``segment_ids`` pack documents, ``softcap`` and ``sinks`` are
the score variants of Gemma 2 and GPT-OSS, and a query with no allowed key gets output 0
and zero gradients, never NaN. It only dispatches: the arguments are
checked by the shared rules (:mod:`attnkit.spec`, :mod:`attnkit.torch._checks`), and the
call runs on one of three paths:

- ``"triton"`` (:mod:`attnkit.torch._triton_path`): attnkit's fused GPU kernel (CUDA,
  fp16/bf16, no mask/bias/valid_lens, no dropout; the variants it takes are listed in
  ``_triton_path.TRITON_VARIANTS``), imported lazily so that nothing here needs Triton.
- ``"sdpa"`` (:mod:`attnkit.torch._sdpa`):
  ``torch.nn.functional.scaled_dot_product_attention``, bottom-right masks built
  explicitly (top-left causal is its own ``is_causal``), rows with no allowed key zeroed
  after the kernel; GQA via ``enable_gqa``; sinks as one extra key; no softcap.
- ``"math"`` (:mod:`attnkit.torch._math`): plain matmul + float32 softmax with an explicit
  empty-row guard. It is the readable baseline and the only path that handles everything
  (double backward included).

On the CPU, ``segment_ids`` whose ids each fill one run of positions (packed documents,
padding) run block by block on the chosen path (:mod:`attnkit.torch._packed`): the cost
is the sum of the documents' squares, not ``Tq * Tk``.

``backend="auto"`` takes the first path that honours the call exactly, in that order. On
the SDPA and math paths, NaN/inf in a key/value row no query may attend is kept out of the
result (:mod:`attnkit.torch._nonfinite`).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch

from ..spec import (
    check_causal,
    check_dropout,
    check_softcap,
    check_window,
    default_scale,
    resolve_band,
    scores_shape,
)
from ._checks import check_bias, check_qkv, check_segment_ids, check_sinks
from ._math import empty_attention, math_path
from ._nonfinite import guard_masked_nonfinite
from ._packed import packed_attention, packed_runs
from ._sdpa import sdpa_path
from ._triton_path import triton_path, triton_reason
from .additive import additive_attention, additive_scores  # re-exported: they lived here
from .masks import Window, attention_mask
from .softmax import safe_softmax  # re-exported: it lived here

__all__ = ["Backend", "additive_attention", "additive_scores", "attention", "safe_softmax"]

Backend = Literal["auto", "sdpa", "math", "triton"]
_BACKENDS = ("auto", "sdpa", "math", "triton")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention, ``softmax(softcap(q k^T * scale) + bias, masked) v``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)`` without a head axis).
        k: ``(..., Hkv, Tk, Dk)``; ``Hkv`` divides ``H`` (GQA/MQA on axis -3).
        v: ``(..., Hkv, Tk, Dv)``; ``Dv`` may differ from ``Dk``.
        mask: bool, True = may attend, broadcastable to ``(..., H, Tq, Tk)``.
        bias: float, broadcastable, added to the scaled scores (``-inf`` excludes).
        valid_lens: ``(B,)`` or ``(B, Tq)`` integers: keys ``j < valid_len`` are valid.
        causal: True or ``"bottom_right"``: query ``i`` sees keys ``j <= i + Tk - Tq``;
            ``"top_left"``: ``j <= i`` (SDPA's and JAX's ``is_causal=True``).
        window: ``(left, right)`` band around the bottom-right diagonal (with either
            causal alignment); None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: scores become ``softcap * tanh(s / softcap)`` after the scale, before the
            bias (Gemma 2); None = off.
        sinks: ``(H,)`` float, one logit per query head, a value-less column in each
            softmax denominator (GPT-OSS); differentiable. Weights then sum to less than 1.
        segment_ids: integer ``(B, T)`` for self-attention, or ``(q_ids (B, Tq),
            kv_ids (B, Tk))``: query ``i`` attends key ``j`` only if their ids are equal;
            an id < 0 is padding (output 0, zero gradients). See
            :func:`attnkit.torch.masks.segment_ids_from_lengths` and friends.
        dropout_p: probability of zeroing a weight; applied only when ``training``.
        training: dropout is active only when True.
        need_weights: also return the pre-dropout weights ``(..., H, Tq, Tk)``. The output
            stays on the fused path; the weights are recomputed from one extra ``q k^T``
            and the kernel's log-sum-exp (``O(Tq*Tk)`` memory, which returning them
            needs anyway).
        backend: ``"auto"`` (see the module docstring), or ``"sdpa"``, ``"math"``,
            ``"triton"`` to force a path; a forced path that cannot honour the call
            raises ``ValueError`` saying why.

    Returns:
        ``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)``. A query with no
        allowed key gets output 0 and weights 0, with zero gradients.

    Reference, without masks::

        w = softmax(q @ k.transpose(-1, -2) * scale)
        out = w @ v
    """
    G = check_qkv(q, k, v)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    dropout_p = check_dropout(dropout_p)
    scale = default_scale(scale, q.shape[-1])
    shape = scores_shape(q, k, G)
    check_bias(bias, shape, q.device)
    window = check_window(window)
    p = dropout_p if training else 0.0
    Tq, Tk = shape[-2], shape[-1]
    causal = check_causal(causal)
    if causal == "top_left" and Tq == Tk:
        causal = "bottom_right"  # the same mask
    softcap = check_softcap(softcap)
    check_sinks(sinks, shape[-3] if len(shape) >= 3 else 1, q.device)
    ids = check_segment_ids(segment_ids, shape, q.device)
    given = {"softcap": softcap, "sinks": sinks, "segment_ids": ids,
             "top_left": causal == "top_left" or None}
    variants = tuple(name for name, value in given.items() if value is not None)

    has_mask = mask is not None or valid_lens is not None
    reason = triton_reason(q, has_mask, bias is not None, p, k, v, variants)
    if backend == "triton" and reason is not None:
        raise ValueError(f"backend='triton' cannot take this call: {reason}")
    if backend == "triton" or (backend == "auto" and reason is None and Tq and Tk):
        return triton_path(q, k, v, G=G, causal=causal or False, window=window, scale=scale,
                           need_weights=need_weights, softcap=softcap, sinks=sinks,
                           segment_ids=ids)
    if backend == "sdpa" and softcap is not None:
        raise ValueError("backend='sdpa' cannot take softcap (SDPA applies no score "
                         "function); use backend='math' or 'auto'")

    if causal == "bottom_right" and Tq == 1:
        causal = None  # one query at the bottom-right corner sees every key
    if ids is not None and not has_mask and bias is None and Tq and Tk:
        rows = _packed_rows(q, ids)
        if rows is not None:  # packed documents on the CPU: block by block
            one_block = partial(attention, softcap=softcap, sinks=sinks, scale=scale,
                                dropout_p=p, training=True, need_weights=need_weights,
                                backend=backend)
            return packed_attention(one_block, q, k, v, rows,
                                    resolve_band(causal, window, Tq, Tk), shape, need_weights)
    keep = attention_mask(shape, mask=mask, valid_lens=valid_lens, causal=causal,
                          window=window, segment_ids=ids, device=q.device)  # all ANDed
    if Tq == 0 or Tk == 0:
        return empty_attention(q, v, shape, need_weights)
    opts = dict(G=G, keep=keep, bias=bias, scale=scale, dropout_p=p, need_weights=need_weights,
                sinks=sinks)
    if backend == "math" or softcap is not None:
        run = partial(math_path, q, softcap=softcap, **opts)
    else:
        # SDPA's own is_causal is top-left: exactly ours when causal is the one constraint
        # and top-left, or bottom-right with Tq == Tk.
        only_causal = (causal == "top_left" or (causal is not None and Tq == Tk)) \
            and not has_mask and window is None and bias is None and ids is None
        run = partial(sdpa_path, q, only_causal=only_causal, **opts)
    return guard_masked_nonfinite(run, k, v, keep, shape, G)


def _packed_rows(q: torch.Tensor, ids: tuple[torch.Tensor, torch.Tensor]) -> list | None:
    """The packed-documents blocks (:func:`attnkit.torch._packed.packed_runs`) when that
    path applies: CPU tensors (reading the ids back stalls no device), not while
    ``torch.compile`` traces (the read would break the graph)."""
    if q.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return packed_runs(*ids)
