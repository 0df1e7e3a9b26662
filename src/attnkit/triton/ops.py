"""attnkit's Triton kernels as ``torch.library`` custom ops, and the public functions on them.

Registered ops (schemas plain: tensors, bools, ints, floats, strings; every option
resolved first)::

    attnkit::flash_fwd(q, k, v, sinks?, causal, left?, right?, scale, softcap?,
                       alibi_slopes?, q_ids?, kv_ids?) -> (out, lse, lse_lo)
        autograd: dq, dk, dv through attnkit::flash_bwd; dsinks in closed form
    attnkit::flash_bwd(dout, q, k, v, out, lse, lse_lo, dlse?, causal, left?, right?,
                       scale, softcap?, alibi_slopes?, q_ids?, kv_ids?) -> (dq, dk, dv)

The LSE travels as the float32 pair the kernel keeps (``lse + lse_lo``, exact at any
magnitude of the logits), so the backward recomputes the probabilities exactly.
    attnkit::decode(q, k_cache, v_cache, cache_len, cache_lens?, scale, softcap?, sinks?,
                    left?, right?, num_splits?) -> (out, lse)

``causal`` is ``"none"``, ``"bottom_right"`` or ``"top_left"``. Each op has a fake
(meta) implementation giving its outputs' shapes and dtypes, so
``torch.compile(fullgraph=True)`` traces through a kernel as one node instead of breaking
the graph at a Triton launch, and ``torch.library.opcheck`` checks the registrations
(tests/triton/test_ops.py). The implementations are the launchers of
:mod:`attnkit.triton.flash` and :mod:`attnkit.triton.decode`; the functions below check
and resolve the options (scale, window, causal alignment, segment ids), call the op, and
shape the result.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from ..spec import check_causal, check_segment_ids, check_window, default_scale
from . import decode as _decode
from . import flash as _flash
from ._variants import sinks_grad

__all__ = [
    "decode_attention",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
]


def _window(left: int | None, right: int | None) -> tuple[int | None, int | None] | None:
    return None if left is None and right is None else (left, right)


def _causal(causal: str) -> bool | str:
    return False if causal == "none" else causal


def _ids(q_ids: Tensor | None, kv_ids: Tensor | None) -> tuple[Tensor, Tensor] | None:
    return None if q_ids is None or kv_ids is None else (q_ids, kv_ids)


def _fake_out(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[-1])), q.new_empty((B, H, Tq), dtype=torch.float32)


def _spec(q: Tensor, k: Tensor, v: Tensor, causal: str, left: int | None, right: int | None,
          scale: float, softcap: float | None, q_ids: Tensor | None,
          kv_ids: Tensor | None) -> object:
    """The launcher's checked options (:func:`attnkit.triton.flash._check`)."""
    return _flash._check(q, k, v, _causal(causal), _window(left, right), scale, softcap,
                         _ids(q_ids, kv_ids))


# -- attnkit::flash_fwd / flash_bwd --------------------------------------------------------


@torch.library.custom_op("attnkit::flash_fwd", mutates_args=())
def _flash_fwd(
    q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, causal: str, left: int | None,
    right: int | None, scale: float, softcap: float | None, alibi_slopes: Tensor | None,
    q_ids: Tensor | None, kv_ids: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    return _flash._forward(
        q, k, v, causal=_causal(causal), window=_window(left, right), scale=scale,
        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
        segment_ids=_ids(q_ids, kv_ids),
    )


@_flash_fwd.register_fake
def _flash_fwd_fake(q, k, v, *options):  # type: ignore[no-untyped-def]
    out, lse = _fake_out(q, v)
    return out, lse, torch.empty_like(lse)


@torch.library.custom_op("attnkit::flash_bwd", mutates_args=())
def _flash_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, lse_lo: Tensor,
    dlse: Tensor | None, causal: str, left: int | None, right: int | None, scale: float,
    softcap: float | None, alibi_slopes: Tensor | None, q_ids: Tensor | None,
    kv_ids: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    spec = _spec(q, k, v, causal, left, right, scale, softcap, q_ids, kv_ids)
    _flash._check_grad_shapes(spec, dout, out, lse, dlse)  # type: ignore[arg-type]
    return _flash._backward(dout, q, k, v, out, lse, lse_lo, spec=spec,
                            alibi_slopes=alibi_slopes, dlse=dlse)


@_flash_bwd.register_fake
def _flash_bwd_fake(dout, q, k, v, *rest):  # type: ignore[no-untyped-def]
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _flash_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    q, k, v, sinks, *options = inputs
    out, lse, lse_lo = output
    ctx.mark_non_differentiable(lse_lo)  # the rounding error of lse: no gradient of its own
    ctx.save_for_backward(q, k, v, out, lse, lse_lo, sinks)
    ctx.options = options  # causal, left, right, scale, softcap, alibi_slopes, q/kv ids


def _flash_backward(ctx, dout, dlse, _dlse_lo):  # type: ignore[no-untyped-def]
    q, k, v, out, lse, lse_lo, sinks = ctx.saved_tensors
    causal, left, right, scale, softcap, alibi_slopes, q_ids, kv_ids = ctx.options
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _flash_bwd(dout, q, k, v, out, lse, lse_lo, dlse, causal, left, right,
                            scale, softcap, alibi_slopes, q_ids, kv_ids)
    dsinks = None
    if sinks is not None and ctx.needs_input_grad[3]:
        dsinks = sinks_grad(sinks.to(device=q.device), out, dout, lse, dlse).to(sinks)
    return (dq, dk, dv, dsinks) + (None,) * 8


def _no_double_backward(ctx, *grads):  # type: ignore[no-untyped-def]
    raise RuntimeError(
        "attnkit.triton: the flash kernels' backward is not differentiable (no double "
        "backward); use attnkit.torch.attention(..., backend='math') to differentiate twice"
    )


_flash_fwd.register_autograd(_flash_backward, setup_context=_flash_setup)
_flash_bwd.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


# -- attnkit::decode ------------------------------------------------------------------------


@torch.library.custom_op("attnkit::decode", mutates_args=())
def _decode_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_len: int, cache_lens: Tensor | None,
    scale: float, softcap: float | None, sinks: Tensor | None, left: int | None,
    right: int | None, num_splits: int | None,
) -> tuple[Tensor, Tensor]:
    return _decode.decode_attention(
        q, k_cache, v_cache, cache_len if cache_lens is None else cache_lens, scale=scale,
        softcap=softcap, sinks=sinks, window=_window(left, right), return_lse=True,
        num_splits=num_splits,
    )


@_decode_op.register_fake
def _decode_fake(q, k_cache, v_cache, *options):  # type: ignore[no-untyped-def]
    return _fake_out(q, v_cache)


# -- the public functions -------------------------------------------------------------------


def _options(
    q: Tensor, window: object, scale: float | None
) -> tuple[int | None, int | None, float]:
    """``(left, right, scale)`` resolved for the ops' plain schemas."""
    if not isinstance(q, Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    win = check_window(window)
    left, right = (None, None) if win is None else win
    return left, right, default_scale(scale, q.shape[-1])


def _segments(
    segment_ids: object, q: Tensor, k: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """``segment_ids`` (one ``(B, T)`` or a pair) as the ops' ``(q_ids, kv_ids)``."""
    if segment_ids is None:
        return None, None
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2]) if q.ndim == 4 and k.ndim == 4 \
        else tuple(q.shape)
    pair = check_segment_ids(segment_ids, shape)
    assert pair is not None
    return tuple(torch.as_tensor(x) for x in pair)  # type: ignore[return-value]


def _alignment(causal: object) -> str:
    return check_causal(causal) or "none"


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    segment_ids: object = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Fused attention with autograd: ``softmax(scale * q k^T [+ features]) v``.

    Args:
        q: ``(B, H, Tq, Dk)``, float16/bfloat16 (float32 for testing).
        k: ``(B, Hkv, Tk, Dk)``; GQA/MQA when ``Hkv < H`` (K/V never expanded).
        v: ``(B, Hkv, Tk, Dv)``.
        causal: True or ``"bottom_right"``: query ``i`` sees key ``j`` iff ``j <= i + Tk -
            Tq``; ``"top_left"`` (SDPA's ``is_causal``): iff ``j <= i``.
        window: ``(left, right)``: key ``j`` allowed iff ``diag - left <= j <= diag +
            right`` with ``diag = i + Tk - Tq`` (whichever the causal alignment); None
            (whole or per side) = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: Gemma-2 style ``softcap * tanh(s / softcap)`` on the scaled scores.
        alibi_slopes: ``(H,)`` or ``(B, H)`` float; adds ``-slope * |i + Tk - Tq - j|``
            to the (capped) scores (FlashAttention's convention; not differentiated).
        sinks: ``(H,)`` float logits (GPT-OSS), differentiable: each adds a column with no
            value to its head's softmax denominator, and enters the LSE.
        segment_ids: int ``(B, T)`` for self-attention, or a pair ``(q_ids (B, Tq),
            kv_ids (B, Tk))``: query ``i`` attends key ``j`` only if their ids are equal;
            an id < 0 (padding) attends and is attended by nothing. Blocks of queries and
            keys whose segments do not meet are skipped (packed documents).
        return_lse: also return the natural-log LSE ``(B, H, Tq)``, float32.

    Returns:
        ``out (B, H, Tq, Dv)``, or ``(out, lse)``. Rows with no allowed key: 0 and -inf
        (with sinks: 0 and the sink). The kernels have no double backward
        (differentiating twice raises).
    """
    left, right, s = _options(q, window, scale)
    q_ids, kv_ids = _segments(segment_ids, q, k)
    out, lse, _ = _flash_fwd(q, k, v, sinks, _alignment(causal), left, right, s, softcap,
                             alibi_slopes, q_ids, kv_ids)
    return (out, lse) if return_lse else out


def flash_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    segment_ids: object = None,
    lse_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Fused attention forward, no autograd: ``(out (B, H, Tq, Dv), lse (B, H, Tq))``.
    Arguments as :func:`flash_attention`; ``lse_dtype=torch.float64`` returns the LSE as
    the kernel keeps it (``hi + lo``), exact enough for the backward and for merging
    partials at any magnitude of the logits (see
    :func:`attnkit.triton.flash.flash_attention_forward`)."""
    if lse_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"lse_dtype must be torch.float32 or torch.float64, got {lse_dtype}")
    left, right, s = _options(q, window, scale)
    q_ids, kv_ids = _segments(segment_ids, q, k)
    with torch.no_grad():
        out, hi, lo = _flash_fwd(q, k, v, sinks, _alignment(causal), left, right, s, softcap,
                                 alibi_slopes, q_ids, kv_ids)
    if lse_dtype == torch.float32:
        return out, hi
    return out, hi.double() + lo.double()  # -inf + 0 = -inf for rows with no key


def flash_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    segment_ids: object = None,
    dlse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused attention backward, no autograd: ``(dq, dk, dv)`` from the forward's ``out``
    and ``lse`` (float32, or float64 for the exact ``hi + lo``; it includes any sinks) and
    an optional ``dlse`` (see :func:`attnkit.triton.flash.flash_attention_backward`)."""
    left, right, s = _options(q, window, scale)
    q_ids, kv_ids = _segments(segment_ids, q, k)
    hi, lo = _split_lse(lse)  # shapes are checked by the op
    return _flash_bwd(dout, q, k, v, out, hi, lo, dlse, _alignment(causal), left, right, s,
                      softcap, alibi_slopes, q_ids, kv_ids)


def _split_lse(lse: Tensor) -> tuple[Tensor, Tensor]:
    """``lse`` as the float32 pair ``hi + lo`` the kernels keep (``lo = 0`` for float32)."""
    hi = lse.to(torch.float32)
    if lse.dtype != torch.float64:
        return hi, torch.zeros_like(hi)
    fin = torch.isfinite(lse)
    return hi, torch.where(fin, lse - torch.where(fin, hi, 0.0).double(), 0.0).float()


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_len: int | Tensor,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    window: tuple[int | None, int | None] | None = None,
    return_lse: bool = False,
    num_splits: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of ``Tq`` new queries over the first ``cache_len`` positions of a KV
    cache, read in place (bottom-right causal among them). ``cache_len``: an int, or a
    ``(B,)`` integer tensor (ragged batches, not read back: clamped to the capacity).
    Other arguments: see :func:`attnkit.triton.decode.decode_attention`, the launcher
    behind the op.

    Returns:
        ``out (B, H, Tq, Dv)`` in q's dtype, or ``(out, lse)``.
    """
    lens = cache_len if isinstance(cache_len, Tensor) else None
    if lens is None:
        try:
            cache_len = operator.index(cache_len)
        except TypeError:
            raise TypeError(f"cache_len must be an int or a (B,) integer tensor, got "
                            f"{type(cache_len).__name__}") from None
    left, right, s = _options(q, window, scale)
    out, lse = _decode_op(q, k_cache, v_cache, 0 if lens is not None else cache_len, lens, s,
                          softcap, sinks, left, right, num_splits)
    return (out, lse) if return_lse else out
