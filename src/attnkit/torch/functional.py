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
and zero gradients, never NaN. It only dispatches: the arguments are checked by the shared
rules (:mod:`attnkit.spec`, :mod:`attnkit.torch._checks`), and the call runs on one of
three paths:

- ``"triton"`` (:mod:`attnkit.torch._triton_path`): attnkit's fused GPU kernel (CUDA,
  fp16/bf16, no mask/bias/valid_lens, no dropout; the variants it takes are listed in
  ``_triton_path.TRITON_VARIANTS``), imported lazily so that nothing here needs Triton.
- ``"sdpa"`` (:mod:`attnkit.torch._sdpa`):
  ``torch.nn.functional.scaled_dot_product_attention``, masks built explicitly (top-left
  causal is its own ``is_causal``); GQA via ``enable_gqa``; sinks as one extra key; no
  softcap.
- ``"math"`` (:mod:`attnkit.torch._math`): plain matmul + float32 softmax with an explicit
  empty-row guard. It is the readable baseline and the only path that handles everything
  (double backward included).

``backend="auto"`` takes the Triton kernel when it honours the call exactly; otherwise the
math path where it is the cheaper one (``need_weights`` in one pass, a masked decoding
step: see :mod:`attnkit.torch._math`), and SDPA for the rest. On the SDPA and math paths
NaN/inf in a masked position reaches no output and no gradient, by tensor ops whose cost
the shapes fix (:mod:`attnkit.torch._nonfinite`): no call reads a tensor back, so none
stalls a GPU stream or breaks a ``torch.compile`` graph. The one exception is opt-in by
its data: on the CPU, ``segment_ids`` whose ids each fill one run of positions (packed
documents, padding) run block by block (:mod:`attnkit.torch._packed`), reading the ids
once (a CPU tensor: no device to stall; skipped under ``torch.compile``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import torch

from ..spec import check_causal, check_dropout, check_softcap, default_scale, resolve_band
from ._checks import check_bias, check_call, check_segment_ids, check_sinks
from ._decode import DECODE_MAX_ROWS, decode_path, takes_decode
from ._keep import build_keep, with_rank
from ._math import math_path
from ._packed import packed_attention, packed_runs
from ._sdpa import plain_sdpa, sdpa_path
from ._triton_path import triton_path, triton_reason
from .additive import additive_attention, additive_scores  # re-exported: they lived here
from .masks import Window
from .softmax import safe_softmax  # re-exported: it lived here

__all__ = [
    "Backend", "additive_attention", "additive_scores", "attend", "attention", "safe_softmax"
]

Backend = Literal["auto", "sdpa", "math", "triton"]
_BACKENDS = ("auto", "sdpa", "math", "triton")

# need_weights under autograd: above this many scores the output comes from the fused
# kernel, whose backward keeps O(T * D), and the weights are computed beside it (freed with
# the caller's reference); below it, one pass (its backward keeps the weights) is cheaper.
ONE_PASS_MAX_SCORES = 1 << 22


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
    training: bool = True,
    need_weights: bool = False,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention, ``softmax(softcap(q k^T * scale) + bias, masked) v``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)`` without a head axis).
        k: ``(..., Hkv, Tk, Dk)``; ``Hkv`` divides ``H`` (GQA/MQA on axis -3).
        v: ``(..., Hkv, Tk, Dv)``; ``Dv`` may differ from ``Dk``.
        mask: bool, True = may attend, broadcastable to ``(..., H, Tq, Tk)`` (any rank).
        bias: float, broadcastable (any rank), added to the scaled scores (``-inf``
            excludes).
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
        dropout_p: probability of zeroing a weight, applied unless ``training=False``.
        training: False turns dropout off (as ``torch.nn.functional.dropout``; modules
            pass ``self.training``).
        need_weights: also return the pre-dropout weights ``(..., H, Tq, Tk)``, computed
            in float32 for half-precision inputs (docs/torch.md says what they cost).
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
    p = check_dropout(dropout_p)
    return attend(q, k, v, mask=mask, bias=bias, valid_lens=valid_lens, causal=causal,
                  window=window, scale=scale, softcap=softcap, sinks=sinks,
                  segment_ids=segment_ids, dropout_p=p if training else 0.0,
                  need_weights=need_weights, backend=backend)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool | str | None = False,
    window: Window | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: Backend = "auto",
    codes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attention` with ``dropout_p`` applied as given (the ``training`` rule done),
    for callers inside attnkit.torch. ``codes``: k and v are a :class:`KVCache` 's buffers
    (no NaN/inf) and ``codes`` what their positions held (:meth:`KVCache.codes`)."""
    G, shape = check_call(q, k, v)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    scale = default_scale(scale, q.shape[-1])
    Tq, Tk = shape[-2], shape[-1]
    if (mask is None and valid_lens is None and bias is None and window is None
            and segment_ids is None and softcap is None and sinks is None and codes is None
            and not need_weights and (not causal or (causal is True and Tq == 1))
            and (backend == "sdpa" or (backend == "auto" and not q.is_cuda))
            and 0 not in shape and 0 not in q.shape and 0 not in v.shape):
        # Nothing masked (one query sees every key under causal): nothing to guard.
        return plain_sdpa(q, k, v, G, scale, dropout_p), None
    causal = check_causal(causal)
    softcap = check_softcap(softcap)
    check_sinks(sinks, shape[-3] if len(shape) >= 3 else 1, q.device)
    ids = check_segment_ids(segment_ids, shape, q.device)
    if bias is not None:
        check_bias(bias, shape, q.device)
        bias = with_rank(bias, len(shape))
    has_mask = mask is not None or valid_lens is not None

    if codes is None and (backend == "triton" or (backend == "auto" and q.is_cuda)):
        given = {"softcap": softcap, "sinks": sinks, "segment_ids": ids,
                 "top_left": (causal == "top_left" and Tq != Tk) or None}
        variants = tuple(name for name, value in given.items() if value is not None)
        reason = triton_reason(q, has_mask, bias is not None, dropout_p, k, v, variants)
        if backend == "triton" and reason is not None:
            raise ValueError(f"backend='triton' cannot take this call: {reason}")
        if reason is None and Tq and Tk:
            keep = build_keep(shape, causal=causal, window=window, segment_ids=ids,
                              device=q.device)
            return triton_path(q, k, v, G=G, keep=keep, causal=causal or False,
                               window=window, scale=scale, need_weights=need_weights,
                               softcap=softcap, sinks=sinks, segment_ids=ids)
    if backend == "sdpa" and softcap is not None:
        raise ValueError("backend='sdpa' cannot take softcap (SDPA applies no score "
                         "function); use backend='math' or 'auto'")
    if ids is not None and not has_mask and bias is None and codes is None and Tq and Tk:
        runs = _packed_runs(q, ids)
        if runs is not None:  # packed documents on the CPU: block by block
            one_block = partial(attend, softcap=softcap, sinks=sinks, scale=scale,
                                dropout_p=dropout_p, need_weights=need_weights,
                                backend=backend)
            return packed_attention(one_block, q, k, v, runs,
                                    resolve_band(causal, window, Tq, Tk), shape, need_weights)

    keep = None
    if has_mask or causal is not None or window is not None or ids is not None:
        keep = build_keep(shape, mask=mask, valid_lens=valid_lens, causal=causal,
                          window=window, segment_ids=ids, device=q.device)
    opts = dict(G=G, shape=shape, keep=keep, bias=bias, scale=scale, dropout_p=dropout_p,
                need_weights=need_weights, sinks=sinks, codes=codes)
    if backend == "math" or softcap is not None or 0 in shape or 0 in q.shape \
            or 0 in v.shape:
        return math_path(q, k, v, softcap=softcap, **opts)  # empty sizes: zeros, in graph
    if backend == "sdpa":
        return sdpa_path(q, k, v, **opts)
    if need_weights and _one_pass(q, k, v, shape):
        return math_path(q, k, v, **opts)
    if keep is not None and codes is None and Tq * G <= DECODE_MAX_ROWS:
        if bias is None and sinks is None and not dropout_p and not need_weights \
                and takes_decode(q, k, v, keep, G, shape):
            return decode_path(q, k, v, G=G, shape=shape, keep=keep, scale=scale), None
        return math_path(q, k, v, select=True, **opts)
    return sdpa_path(q, k, v, **opts)


def _one_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """need_weights: one pass (scores once, softmax, weights x V) rather than the fused
    kernel plus the weights beside it. Always without autograd (one pass computes less and
    holds one ``Tq x Tk`` buffer); with autograd only while the weights its backward keeps
    are small."""
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return True
    return math.prod(shape) <= ONE_PASS_MAX_SCORES


def _packed_runs(q: torch.Tensor, ids: tuple[torch.Tensor, torch.Tensor]) -> list | None:
    """The packed-documents blocks (:func:`attnkit.torch._packed.packed_runs`) when that
    path applies: CPU tensors (reading the ids back stalls no device), not while
    ``torch.compile`` traces (the read would break the graph)."""
    if q.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return packed_runs(*ids)
