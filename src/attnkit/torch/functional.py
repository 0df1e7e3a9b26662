"""Functional attention for PyTorch: one entry point, a plan, and four paths.

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

:func:`attention` computes ``softmax(q k^T * scale + bias, masked) v`` with the semantics of
:mod:`attnkit.numpy` (its float64 oracle). It checks the arguments, describes the call by
its structure (:class:`Call`: shapes and which arguments are given, never their values),
asks :func:`plan` for a path, and runs it:

- ``"sdpa"`` (:mod:`attnkit.torch._sdpa`):
  ``torch.nn.functional.scaled_dot_product_attention`` with the mask it needs (SDPA's own
  ``is_causal`` where that is the only constraint), GQA via ``enable_gqa``, sinks as one
  extra key.
- ``"math"`` (:mod:`attnkit.torch._math`): plain matmuls and a float32 softmax; the only
  path that takes everything (softcap, empty sizes, double backward), and the cheaper one
  for ``need_weights`` without autograd.
- ``"triton"`` (:mod:`attnkit.torch._triton_path`): attnkit's fused GPU kernel (CUDA,
  fp16/bf16, no mask/bias/valid_lens, no dropout), imported lazily.
- ``"packed"`` (:mod:`attnkit.torch._packed`): ``segment_ids`` whose ids each fill one run
  of positions, on the CPU, block by block (the runs are read from each call's ids).

The contract (docs/torch.md): a query with no allowed key gets output 0, weights 0 and zero
gradients; masked scores are ``-inf`` or a select; NaN/inf in an attended position
propagates; what a masked position of q/k/v holds is the caller's (it may reach the output
through ``0 * nan``, as in SDPA; ``check_finite=True`` finds it); no default path reads a
tensor back from a GPU or breaks a ``torch.compile`` graph.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.nn import functional as F

from ._dtypes import stats_dtype
from ._math import math_path
from ._packed import PackedIds, packed_attention, packed_runs
from ._plan import ONE_PASS_MAX_SCORES, Backend, Call, Plan, may_pack, plan  # re-exported
from ._scores import additive_mask, attention_weights, weights_mask
from ._sdpa import bias_as, first_order_only, sdpa_path
from ._signature import Prepared, lean_step, prepare, prepared, step_lengths_mask
from ._triton_path import triton_path
from .additive import additive_attention, additive_scores  # re-exported: they lived here
from .masks import Window, combine_masks
from .softmax import safe_softmax  # re-exported: it lived here

__all__ = [
    "ONE_PASS_MAX_SCORES", "Backend", "Call", "Plan", "additive_attention", "additive_scores",
    "attention", "may_pack", "plan", "safe_softmax",
]



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
    check_finite: bool = False,
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
            Checked on the CPU (``ValueError`` naming min and max); on a GPU clamped to
            ``[0, Tk]`` (no device-side assert, no host sync).
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
        backend: ``"auto"`` (see :func:`plan`), or ``"sdpa"``, ``"math"``, ``"triton"``
            to force a path; a forced path that cannot honour the call raises
            ``ValueError`` saying why.
        check_finite: first read q, k and v back and raise ``ValueError`` naming the
            tensor, batch, head and position of the first NaN/inf entry and whether that
            position is masked (opt-in, like anomaly detection: it costs a host sync).

    Returns:
        ``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)``. A query with no
        allowed key gets output 0 and weights 0, with zero gradients.

    Reference, without masks::

        w = softmax(q @ k.transpose(-1, -2) * scale)
        out = w @ v
    """
    prep = None
    if bias is None and window is None and scale is None and softcap is None \
            and sinks is None and segment_ids is None and not need_weights \
            and not check_finite and backend == "auto" and type(dropout_p) is float \
            and dropout_p == 0.0:
        # A decoding step's call: checked once per signature, Tk left out (lean_step).
        prep = lean_step(q, k, v, mask, valid_lens, causal)
        if prep is not None and prep.lean:
            try:
                return _lean(q, k, v, mask, valid_lens, prep), None
            except RuntimeError:  # k or v of another dtype or device than q's?
                prepare(q, k, v, mask, None, valid_lens, causal, None, None, None, None,
                        None, 0.0, False, False, "auto")  # raises, naming what is wrong
                raise
    if prep is None:
        prep = prepared(q, k, v, mask, bias, valid_lens, causal, window, scale, softcap,
                        sinks, segment_ids, dropout_p, training, need_weights, backend)
    if prep.lean and not check_finite:  # SDPA with the caller's mask and/or valid_lens
        return _lean(q, k, v, mask, valid_lens, prep), None
    G, shape, call, how = prep.G, prep.shape, prep.call, prep.how
    causal, window, softcap, scale, p = prep.causal, prep.window, prep.softcap, prep.scale, prep.p
    dev = q.device
    if prep.mask_view is not None:
        mask = mask.reshape(prep.mask_view)
    if prep.bias_view is not None:
        bias = bias.reshape(prep.bias_view)
    ids = None
    if segment_ids is not None:  # checked: one (B, T) tensor, or a pair
        ids = segment_ids if isinstance(segment_ids, tuple) else tuple(segment_ids) \
            if isinstance(segment_ids, list) else (segment_ids, segment_ids)

    def masks(band: tuple[int | None, int | None] = (None, None)) -> torch.Tensor | None:
        """The bool mask (True = may attend) of the given constraints, or None."""
        if mask is None and valid_lens is None and ids is None \
                and band[0] is None and band[1] is None:
            return None
        return combine_masks(shape, mask=mask, valid_lens=valid_lens, band=band,
                             segment_ids=ids, device=dev)

    if check_finite:
        _check_finite(q, k, v, G, shape, masks(prep.band), bias)
    runs = None
    if prep.may_pack and not torch.compiler.is_compiling():
        runs = ids.runs() if isinstance(ids, PackedIds) else packed_runs(*ids)
        if runs is not None:
            call = call._replace(packed=True)
            how = plan(call)
    band = prep.band if how.band else (None, None)

    match how.path:
        case "sdpa":
            allowed = masks(band)
            attn_mask = allowed
            if bias is not None:
                attn_mask = bias_as(bias, q.dtype)
                if allowed is not None:
                    attn_mask = torch.where(allowed, attn_mask, float("-inf"))
            out = sdpa_path(q, k, v, G=G, attn_mask=attn_mask, is_causal=how.is_causal,
                            scale=scale, dropout_p=p, sinks=sinks)
            if not need_weights:
                return out, None
            if how.is_causal:  # the weights need the band the kernel applied itself
                allowed = masks(prep.band)
            add, rows = additive_mask(allowed, bias, stats_dtype(q.dtype),
                                      empty_rows=how.empty_rows and sinks is None)
            w = attention_weights(q, k, G, scale, add, weights_mask(allowed, rows, True),
                                  sinks=sinks)
            return out, w.to(q.dtype)
        case "math":
            return math_path(q, k, v, G=G, allowed=masks(band), bias=bias,
                             empty_rows=how.empty_rows, scale=scale, dropout_p=p,
                             need_weights=need_weights, softcap=softcap, sinks=sinks)
        case "triton":
            allowed = masks(prep.band) if need_weights else None
            return triton_path(q, k, v, G=G, causal=causal or False, window=window,
                               scale=scale, need_weights=need_weights, allowed=allowed,
                               softcap=softcap, sinks=sinks, segment_ids=ids)
        case "packed":
            one_block = partial(attention, softcap=softcap, sinks=sinks, scale=scale,
                                dropout_p=p, need_weights=need_weights, backend=backend)
            return packed_attention(one_block, q, k, v, runs, prep.band, shape, need_weights)
    raise AssertionError(f"no path {how.path!r}")  # pragma: no cover


def _lean(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          valid_lens: torch.Tensor | None, prep: Prepared) -> torch.Tensor:
    """SDPA with at most the caller's mask and ``valid_lens`` (a :class:`Prepared` that
    is ``lean``): nothing to check, reshape or add."""
    allowed = mask
    if valid_lens is not None:
        allowed = step_lengths_mask(valid_lens, prep.lengths_view, k.shape[-2])
        if mask is not None:
            allowed = mask & allowed
    if prep.G == 1 and prep.sdpa_scale is None:  # SDPA's own defaults: called here
        out = F.scaled_dot_product_attention(q, k, v, allowed, prep.p, prep.how.is_causal)
        return first_order_only(out) if out.requires_grad else out
    return sdpa_path(q, k, v, G=prep.G, attn_mask=allowed, is_causal=prep.how.is_causal,
                     scale=prep.sdpa_scale, dropout_p=prep.p)


def _check_finite(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: int, shape: tuple[int, ...],
    allowed: torch.Tensor | None, bias: torch.Tensor | None,
) -> None:
    """``ValueError`` naming the first NaN/inf entry of q, k or v (tensor, batch, head,
    position) and whether its position is masked: a query with no allowed key, or a key
    or value that no query of its heads may attend."""
    if bias is not None:
        kept = bias != float("-inf")
        allowed = kept if allowed is None else allowed & kept
    for name, x in (("q", q), ("k", k), ("v", v)):
        bad = ~torch.isfinite(x)
        if not bool(bad.any()):
            continue
        where = [int(i) for i in torch.unravel_index(bad.flatten().int().argmax(), x.shape)]
        lead, pos = where[:-2], where[-2]
        masked = allowed is not None and not bool(
            _slice_of(allowed.expand(shape), x.shape, lead, pos, G if name != "q" else 1,
                      query=name == "q").any())
        heads = len(shape) >= 3
        batch = tuple(lead[:-1] if heads else lead)
        raise ValueError(
            f"{name} {tuple(x.shape)} holds {x[tuple(where)].item()} at batch {batch}, "
            f"head {lead[-1] if heads and lead else None}, position {pos} (feature "
            f"{where[-1]}); that position is {'masked' if masked else 'attended'}"
        )


def _slice_of(
    full: torch.Tensor, x_shape: torch.Size, lead: list[int], pos: int, G: int, *,
    query: bool,
) -> torch.Tensor:
    """The part of the mask ``full (..., H, Tq, Tk)`` that concerns entry ``(*lead, pos)``
    of an input of shape ``x_shape``: its query row, or its key column over the ``G``
    query heads sharing a key/value head; an axis the input broadcasts is taken whole."""
    n, sel = full.ndim - 2, []
    for axis in range(n):
        xa = axis - (n - len(lead))  # the input's axis, aligned from the right
        if xa < 0 or (x_shape[xa] == 1 and full.shape[axis] != 1):
            sel.append(slice(None))
        elif axis == n - 1:  # the head axis
            sel.append(slice(lead[xa] * G, (lead[xa] + 1) * G))
        else:
            sel.append(slice(lead[xa], lead[xa] + 1))
    part = full[tuple(sel)]
    return part[..., pos, :] if query else part[..., pos]
