"""Validate once per call signature: everything :func:`attnkit.torch.attention` checks and
decides that does not depend on what its tensors hold, kept per signature so that a
decoding step pays a dict lookup instead of the checks (docs/torch.md, "What is kept
between calls, and why it cannot go stale").
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..spec import (
    check_causal,
    check_dropout,
    check_length_range,
    check_softcap,
    check_window,
    default_scale,
    resolve_band,
)
from . import masks
from ._checks import (
    check_bias,
    check_call,
    check_mask,
    check_segment_ids,
    check_sinks,
    valid_lens_view,
)
from ._packed import PackedIds
from ._plan import _BACKENDS, Call, Plan, may_pack, plan
from ._triton_path import triton_reason
from .masks import _INTEGER_DTYPES, lengths_mask, positions_of

__all__ = ["Prepared", "lean_step", "prepared", "step_lengths_mask"]

class Prepared(NamedTuple):
    """What the checks of one call signature found (:func:`prepare`): everything about a
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
    may_pack: bool  # the packed path could take it, once the ids are read
    lean: bool  # SDPA with at most the caller's mask and valid_lens, nothing to add


# Checked call signatures -> their Prepared. A signature is the call's structure only:
# shapes, dtypes and devices of the tensors given, and the Python scalars (with their
# types, so that True and 1 stay apart). Never a value a tensor holds, nor anything kept
# on a caller's tensor: values are read (or used by the kernel) in every call, so a write
# through `.data` or a shared NumPy array, or an inference tensor, cannot meet a stale
# answer. Bounded; cleared when full.
_PREPARED: dict[tuple, Prepared] = {}
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


def prepared(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: object, bias: object,
    valid_lens: object, causal: object, window: object, scale: object, softcap: object,
    sinks: object, segment_ids: object, dropout_p: object, training: object,
    need_weights: object, backend: object,
) -> Prepared:
    """:func:`prepare`'s answer for this call's signature: looked up (a decoding step
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
    prep = prepare(q, k, v, mask, bias, valid_lens, causal, window, scale, softcap, sinks,
                    segment_ids, dropout_p, training, need_weights, backend)
    if key is not None:
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[key] = prep
    return prep


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: object, bias: object,
    valid_lens: object, causal: object, window: object, scale: object, softcap: object,
    sinks: object, segment_ids: object, dropout_p: object, training: object,
    need_weights: object, backend: object,
) -> Prepared:
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
    lengths_view = None
    if isinstance(valid_lens, torch.Tensor):
        lengths_view = valid_lens_view(tuple(valid_lens.shape), shape)
    mask_view = None if mask is None else view(mask)
    lean = (how.path == "sdpa" and not how.band and not need_weights and bias is None
            and sinks is None and ids is None and mask_view is None
            and (mask is None or mask.device == dev)
            and (valid_lens is None or (lengths_view is not None and valid_lens.device == dev)))
    return Prepared(
        G, shape, call, how, scale, None if given_scale is None else scale, p, causal, window,
        softcap,
        resolve_band(causal, window, shape[-2], shape[-1]),
        mask_view, None if bias is None else view(bias), lengths_view,
        ids is not None and may_pack(call), lean,
    )


# -- the decoding step ------------------------------------------------------------------
#
# A call with no argument but q, k, v and at most mask, valid_lens and causal, which SDPA
# takes with nothing added (Prepared.lean). One query under bottom-right (or no) causal
# sees every key, so its checks and its plan are the same for every key length Tk >= 1:
# its signature leaves Tk out, and a decoding loop, whose Tk grows by one per step, is
# checked once rather than at every step. The signature holds q's dtype and device but
# not k's and v's: SDPA refuses k or v of another dtype or device than q's, and the
# caller (attention()) then runs the checks, which name what is wrong.
_STEPS: dict[tuple, Prepared] = {}
_is_compiling = torch.compiler.is_compiling


def lean_step(q: object, k: object, v: object, mask: object, valid_lens: object,
              causal: object) -> Prepared | None:
    """:func:`prepared` for ``attention(q, k, v[, mask][, valid_lens][, causal])``; for
    one query that SDPA takes with nothing added (``lean``), kept under a signature
    without Tk. None when an argument is not a plain tensor (:func:`prepared` then
    checks it, and raises what is wrong)."""
    Tensor = torch.Tensor
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor \
            or _is_compiling():
        return None
    qs, ks, vs = q.shape, k.shape, v.shape
    key = None
    try:
        if len(ks) == 4 and len(vs) == 4 and qs[-2] == 1 and (
                causal is False or causal is True
                or (type(causal) is str and causal == "bottom_right")):
            kB, kH, Tk, Dk = ks  # unpacked: slicing a torch.Size costs more than a lookup
            vB, vH, Tv, Dv = vs
            if Tk >= 1 and Tv == Tk:
                vl_key = None if valid_lens is None else _tensor_key(valid_lens)
                if mask is None:
                    key = (qs, kB, kH, Dk, vB, vH, Dv, q.dtype, q.device, causal, vl_key)
                elif type(mask) is Tensor and mask.ndim == 4:
                    mB, mH, mQ, mK = mask.shape
                    key = (qs, kB, kH, Dk, vB, vH, Dv, q.dtype, q.device, causal, vl_key,
                           mB, mH, mQ, -1 if mK == Tk else mK, mask.dtype, mask.device)
                if key is not None:
                    found = _STEPS.get(key)
                    if found is not None:
                        return found
    except (_Unkeyed, IndexError, TypeError):
        return None
    prep = prepared(q, k, v, mask, None, valid_lens, causal, None, None, None, None, None,
                    0.0, False, False, "auto")
    if key is not None and prep.lean:
        if len(_STEPS) >= _PREPARED_MAX:
            _STEPS.clear()
        _STEPS[key] = prep
    return prep


# valid_lens' values -> their key mask, for (B,) integer lengths on the CPU: each call
# reads them anyway to check them, and a decoding step over the same lengths (the
# encoder's, in a seq2seq decoder's cross-attention) then reuses one mask instead of
# building it. Keyed on the values read in this call, never on the tensor. Bounded.
_LENGTH_MASKS: dict[tuple, torch.Tensor] = {}
_LENGTH_MASKS_MAX = 256


def step_lengths_mask(valid_lens: torch.Tensor, view: tuple[int, ...], Tk: int
                      ) -> torch.Tensor:
    """``valid_lens`` as the bool key mask ``positions < valid_lens.view(view)``, their
    values checked; kept per values when they are (B,) integers read on the CPU."""
    if valid_lens.ndim != 1 or valid_lens.dtype not in _INTEGER_DTYPES \
            or not masks._on_host(valid_lens):
        return lengths_mask(valid_lens, view, positions_of(Tk, valid_lens.device))
    values = tuple(valid_lens.tolist())
    key = (values, view, Tk)
    found = _LENGTH_MASKS.get(key)
    if found is not None:
        return found
    if values and (min(values) < 0 or max(values) > Tk):
        check_length_range(min(values), max(values), Tk)
    # Never an inference tensor: a later call outside torch.inference_mode() may use it.
    with torch.inference_mode(False):
        allowed = positions_of(Tk, valid_lens.device) < valid_lens.view(view)
    if len(_LENGTH_MASKS) >= _LENGTH_MASKS_MAX:
        _LENGTH_MASKS.clear()
    _LENGTH_MASKS[key] = allowed
    return allowed
