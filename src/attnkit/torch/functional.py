"""Functional attention for PyTorch: one entry point, three interchangeable paths.

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

:func:`attention` computes ``softmax(q k^T * scale + bias, masked) v`` with the semantics of
:mod:`attnkit.numpy` (its float64 oracle): masks say True = may attend, ``causal`` and
``window`` are bottom-right aligned, ``valid_lens`` follows d2l, and a query with no allowed
key gets output 0 and zero gradients, never NaN. It only dispatches: the arguments are
checked by the shared rules (:mod:`attnkit.spec`, :mod:`attnkit.torch._checks`), and the
call runs on one of three paths:

- ``"triton"`` (:mod:`attnkit.torch._triton_path`): attnkit's fused GPU kernel (CUDA,
  fp16/bf16, no mask/bias/valid_lens, no dropout), imported lazily so that nothing here
  needs Triton.
- ``"sdpa"`` (:mod:`attnkit.torch._sdpa`):
  ``torch.nn.functional.scaled_dot_product_attention``, bottom-right masks built
  explicitly, rows with no allowed key zeroed after the kernel; GQA via ``enable_gqa``.
- ``"math"`` (:mod:`attnkit.torch._math`): plain matmul + float32 softmax with an explicit
  empty-row guard. It is the readable baseline and the only path that handles everything
  (double backward included).

``backend="auto"`` takes the first path that honours the call exactly, in that order. On
the SDPA and math paths, NaN/inf in a key/value row no query may attend is kept out of the
result (:mod:`attnkit.torch._nonfinite`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..spec import check_dropout, default_scale
from ._checks import check_bias, check_call
from ._keep import build_keep, with_rank
from ._math import math_path
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
# A masked call with at most this many query rows per key/value head (decoding) takes the
# math path, masking the small (Tq, Tk) scores with a select (see attnkit.torch._math).
DECODE_MAX_ROWS = 8


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: Window | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = True,
    need_weights: bool = False,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention, ``softmax(q k^T * scale + bias, masked) v``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)`` without a head axis).
        k: ``(..., Hkv, Tk, Dk)``; ``Hkv`` divides ``H`` (GQA/MQA on axis -3).
        v: ``(..., Hkv, Tk, Dv)``; ``Dv`` may differ from ``Dk``.
        mask: bool, True = may attend, broadcastable to ``(..., H, Tq, Tk)`` (any rank).
        bias: float, broadcastable, added to the scaled scores (``-inf`` excludes).
        valid_lens: ``(B,)`` or ``(B, Tq)`` integers: keys ``j < valid_len`` are valid.
        causal: bottom-right aligned causal mask (query ``i`` sees keys
            ``j <= i + Tk - Tq``).
        window: ``(left, right)`` band around that diagonal; None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        dropout_p: probability of zeroing a weight, applied unless ``training=False``.
        training: False turns dropout off (as ``torch.nn.functional.dropout``; modules
            pass ``self.training``).
        need_weights: also return the pre-dropout weights ``(..., H, Tq, Tk)``, computed
            in float32 for half-precision inputs (see docs/torch.md for what they cost).
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
                  window=window, scale=scale, dropout_p=p if training else 0.0,
                  need_weights=need_weights, backend=backend)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    valid_lens: torch.Tensor | None,
    causal: bool,
    window: Window | None,
    scale: float | None,
    dropout_p: float,
    need_weights: bool,
    backend: Backend,
    codes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attention` after its dropout rule (``dropout_p`` is applied as given), for
    callers inside attnkit.torch. ``codes``: k and v are a :class:`KVCache` 's buffers
    (no NaN/inf) and ``codes`` what their positions held (:meth:`KVCache.codes`)."""
    G, shape = check_call(q, k, v)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    p = dropout_p
    scale = default_scale(scale, q.shape[-1])
    if (mask is None and valid_lens is None and bias is None and window is None
            and not need_weights and codes is None and (not causal or shape[-2] == 1)
            and (backend == "sdpa" or (backend == "auto" and not q.is_cuda))
            and 0 not in shape and 0 not in q.shape and 0 not in v.shape):
        # Nothing masked (one query sees every key under causal): nothing to guard.
        return plain_sdpa(q, k, v, G, scale, p), None
    if bias is not None:
        check_bias(bias, shape, q.device)
        bias = with_rank(bias, len(shape))
    keep = None
    if mask is not None or valid_lens is not None or causal or window is not None:
        keep = build_keep(shape, mask=mask, valid_lens=valid_lens, causal=causal,
                          window=window, device=q.device)
    Tq, Tk = shape[-2], shape[-1]

    if codes is None and (backend == "triton" or (backend == "auto" and q.is_cuda)):
        has_mask = mask is not None or valid_lens is not None
        reason = triton_reason(q, has_mask, bias is not None, p, k, v)
        if backend == "triton" and reason is not None:
            raise ValueError(f"backend='triton' cannot take this call: {reason}")
        if reason is None and Tq and Tk:
            return triton_path(q, k, v, G=G, causal=causal, window=window, scale=scale,
                               need_weights=need_weights)

    opts = dict(G=G, shape=shape, keep=keep, bias=bias, scale=scale, dropout_p=p,
                need_weights=need_weights, codes=codes)
    if backend == "math" or 0 in shape or 0 in q.shape or 0 in v.shape:
        return math_path(q, k, v, **opts)  # also every empty size: zeros with a grad_fn
    if backend == "sdpa":
        return sdpa_path(q, k, v, **opts)
    if need_weights and _one_pass(q, k, v, shape):
        return math_path(q, k, v, **opts)
    if keep is not None and codes is None and Tq * G <= DECODE_MAX_ROWS:
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
