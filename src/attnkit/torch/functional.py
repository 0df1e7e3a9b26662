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

import math
from functools import lru_cache, partial
from typing import Literal, NamedTuple

import torch
from torch.nn import functional as F

from ..spec import (
    check_causal,
    check_dropout,
    check_softcap,
    check_window,
    default_scale,
    resolve_band,
)
from ._checks import check_bias, check_call, check_segment_ids, check_sinks
from ._dtypes import stats_dtype
from ._math import math_path
from ._packed import PackedIds, packed_attention, packed_runs
from ._scores import additive_mask, attention_weights, weights_mask
from ._sdpa import bias_as, first_order_only, sdpa_path
from ._triton_path import triton_path, triton_reason
from .additive import additive_attention, additive_scores  # re-exported: they lived here
from .masks import (
    Window,
    check_mask,
    combine_masks,
    lengths_mask,
    positions_of,
    valid_lens_view,
)
from .softmax import safe_softmax  # re-exported: it lived here

__all__ = [
    "Backend", "Call", "Plan", "additive_attention", "additive_scores", "attention", "plan",
    "safe_softmax",
]

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
    prep = _prepared(q, k, v, mask, bias, valid_lens, causal, window, scale, softcap, sinks,
                     segment_ids, dropout_p, training, need_weights, backend)
    if prep.lean and not check_finite:  # SDPA with the caller's mask and/or valid_lens
        allowed = mask
        if valid_lens is not None:
            allowed = lengths_mask(valid_lens, prep.lengths_view, prep.positions)
            if mask is not None:
                allowed = mask & allowed
        if prep.G == 1 and prep.sdpa_scale is None:  # SDPA's own defaults: called here
            out = F.scaled_dot_product_attention(q, k, v, allowed, prep.p, prep.how.is_causal)
            return (first_order_only(out) if out.requires_grad else out), None
        return sdpa_path(q, k, v, G=prep.G, attn_mask=allowed, is_causal=prep.how.is_causal,
                         scale=prep.sdpa_scale, dropout_p=prep.p), None
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


# -- validate once per call signature -------------------------------------------------------


class _Prepared(NamedTuple):
    """What the checks of one call signature found (:func:`_prepare`): everything about a
    call that does not depend on what its tensors hold."""

    G: int
    shape: tuple[int, ...]  # the scores (..., H, Tq, Tk)
    call: Call
    how: Plan  # plan(call), before packed runs are looked for
    scale: float
    sdpa_scale: float | None  # None when it is SDPA's own default, 1/sqrt(Dk)
    p: float  # dropout probability in effect
    causal: str | None
    window: tuple[int | None, int | None] | None
    softcap: float | None
    band: tuple[int | None, int | None]  # causal and window as one band
    mask_view: tuple[int, ...] | None  # the mask's shape with leading ones, when reshaped
    bias_view: tuple[int, ...] | None
    lengths_view: tuple[int, ...] | None  # valid_lens as key counts against the scores
    positions: torch.Tensor | None  # arange(Tk) on valid_lens' device (attnkit's own)
    may_pack: bool  # the packed path could take it, once the ids are read
    lean: bool  # SDPA with at most the caller's mask and valid_lens, nothing to add


# Checked call signatures -> their _Prepared. A signature is the call's structure only:
# shapes, dtypes and devices of the tensors given, and the Python scalars (with their
# types, so that True and 1 stay apart). Never a value a tensor holds, nor anything kept
# on a caller's tensor: values are read (or used by the kernel) in every call, so a write
# through `.data` or a shared NumPy array, or an inference tensor, cannot meet a stale
# answer. Bounded; cleared when full.
_PREPARED: dict[tuple, _Prepared] = {}
_PREPARED_MAX = 2048
_SCALARS = (type(None), float, int, bool)


def _tensor_key(x: object) -> tuple | None:
    """The structure of an optional tensor argument; ``_Unkeyed`` for anything that is
    not a plain tensor (a subclass or another type takes the checked path every call)."""
    if type(x) is torch.Tensor:
        return (x.shape, x.dtype, x.device)
    raise _Unkeyed


def _ids_key(ids: object) -> tuple:
    if type(ids) is torch.Tensor:
        return (ids.shape, ids.dtype, ids.device)
    if type(ids) in (tuple, PackedIds) and len(ids) == 2:  # type: ignore[arg-type]
        return (type(ids), _tensor_key(ids[0]), _tensor_key(ids[1]))  # type: ignore[index]
    raise _Unkeyed


class _Unkeyed(Exception):
    """An argument that has no signature: the call is checked in full."""


def _prepared(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: object, bias: object,
    valid_lens: object, causal: object, window: object, scale: object, softcap: object,
    sinks: object, segment_ids: object, dropout_p: object, training: object,
    need_weights: object, backend: object,
) -> _Prepared:
    """:func:`_prepare`'s answer for this call's signature: looked up (a decoding step
    pays a dict lookup, not the checks), or checked and kept. While ``torch.compile``
    traces, checked every time (each graph is traced once)."""
    Tensor = torch.Tensor
    key = None
    if type(q) is Tensor and type(k) is Tensor and type(v) is Tensor \
            and not torch.compiler.is_compiling():
        try:
            if bias is None and window is None and softcap is None and sinks is None \
                    and segment_ids is None and type(dropout_p) is float and dropout_p == 0.0 \
                    and (scale is None or type(scale) is float) and not need_weights \
                    and backend == "auto":
                # The decoding step's signature: short, so that it hashes fast.
                key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device,
                       k.device, v.device, causal, type(causal), scale,
                       None if mask is None else _tensor_key(mask),
                       None if valid_lens is None else _tensor_key(valid_lens))
            elif type(scale) in _SCALARS and type(softcap) in _SCALARS \
                    and type(dropout_p) in _SCALARS:
                key = (
                    q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device,
                    k.device, v.device, causal, type(causal),
                    None if mask is None else _tensor_key(mask),
                    None if valid_lens is None else _tensor_key(valid_lens),
                    None if bias is None else _tensor_key(bias),
                    None if sinks is None else _tensor_key(sinks),
                    None if segment_ids is None else _ids_key(segment_ids),
                    None if window is None else (type(window), window, *map(type, window)),
                    scale, type(scale), softcap, type(softcap), dropout_p, type(dropout_p),
                    bool(training), bool(need_weights), backend,
                    bool(need_weights) and torch.is_grad_enabled()
                    and (q.requires_grad or k.requires_grad or v.requires_grad),
                )
            found = None if key is None else _PREPARED.get(key)
        except (_Unkeyed, TypeError):  # TypeError: an unhashable argument
            key = found = None
        if found is not None:
            return found
    prep = _prepare(q, k, v, mask, bias, valid_lens, causal, window, scale, softcap, sinks,
                    segment_ids, dropout_p, training, need_weights, backend)
    if key is not None:
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[key] = prep
    return prep


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: object, bias: object,
    valid_lens: object, causal: object, window: object, scale: object, softcap: object,
    sinks: object, segment_ids: object, dropout_p: object, training: object,
    need_weights: object, backend: object,
) -> _Prepared:
    """Every check of :func:`attention` that reads no tensor's values, and the plan: a
    pure function of the call's structure. Raises ``ValueError``/``TypeError`` naming
    the caller's shapes and values."""
    G, shape = check_call(q, k, v)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    dev = q.device
    p = check_dropout(dropout_p) if training and dropout_p else 0.0
    given_scale = scale
    scale = default_scale(scale, q.shape[-1])
    causal = check_causal(causal) if causal is not False else None
    window = check_window(window) if window is not None else None
    softcap = check_softcap(softcap) if softcap is not None else None
    if sinks is not None:
        check_sinks(sinks, shape[-3] if len(shape) >= 3 else 1, dev)
    ids = check_segment_ids(segment_ids, shape, dev) if segment_ids is not None else None
    if bias is not None:
        check_bias(bias, shape, dev)
    if mask is not None:
        check_mask(mask, shape)  # before any reshape: the message names the caller's shape
    grad = bool(need_weights) and torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad)
    masked = mask is not None or valid_lens is not None
    device = "cuda" if q.is_cuda else dev.type
    why = "not asked for" if backend not in ("auto", "triton") else triton_reason(
        device, q.dtype, q.shape, k.shape, v.shape[-1], masked, bias is not None, p > 0.0)
    call = Call(backend, device, why, q.shape, v.shape[-1], shape, masked, bias is not None,
                causal, window, ids is not None, False, softcap is not None,
                sinks is not None, p > 0.0, bool(need_weights), grad)

    def view(x: torch.Tensor) -> tuple[int, ...] | None:
        """``x``'s shape with leading ones up to the scores' rank (0-D and 1-D masks and
        biases then broadcast like any other), or None when it has that rank."""
        n = len(shape) - x.ndim
        return None if n <= 0 else (1,) * n + tuple(x.shape)

    how = plan(call)
    lengths_view = positions = None
    if isinstance(valid_lens, torch.Tensor):
        lengths_view = valid_lens_view(tuple(valid_lens.shape), shape)
        positions = positions_of(shape[-1], valid_lens.device)
    mask_view = None if mask is None else view(mask)
    lean = (how.path == "sdpa" and not how.band and not need_weights and bias is None
            and sinks is None and ids is None and mask_view is None
            and (mask is None or mask.device == dev)
            and (valid_lens is None or (lengths_view is not None and valid_lens.device == dev)))
    return _Prepared(
        G, shape, call, how, scale, None if given_scale is None else scale, p, causal, window,
        softcap,
        resolve_band(causal, window, shape[-2], shape[-1]),
        mask_view, None if bias is None else view(bias), lengths_view, positions,
        ids is not None and may_pack(call), lean,
    )


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
