"""attnkit's Triton kernels as ``torch.library`` custom ops, and the public functions on them.

Registered ops (schemas plain: tensors, bools, ints, floats; every option resolved first)::

    attnkit::flash_fwd(q, k, v, causal, left?, right?, scale, softcap?, alibi_slopes?)
        -> (out, lse)                       autograd through attnkit::flash_bwd
    attnkit::flash_bwd(dout, q, k, v, out, lse, dlse?, causal, left?, right?, scale,
                       softcap?, alibi_slopes?) -> (dq, dk, dv)
    attnkit::decode(q, k_cache, v_cache, cache_len, scale, num_splits?) -> (out, lse)

Each has a fake (meta) implementation giving its outputs' shapes and dtypes, so
``torch.compile(fullgraph=True)`` traces through a kernel as one node instead of breaking
the graph at a Triton launch, and ``torch.library.opcheck`` checks the registrations
(tests/triton/test_ops.py). The implementations are the launchers of
:mod:`attnkit.triton.flash` and :mod:`attnkit.triton.decode`; the functions below check
and resolve the options (scale, window), call the op, and shape the result.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from ..spec import check_qkv, check_window, default_scale
from . import decode as _decode
from . import flash as _flash

__all__ = [
    "decode_attention",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
]


def _window(left: int | None, right: int | None) -> tuple[int | None, int | None] | None:
    return None if left is None and right is None else (left, right)


# -- attnkit::flash_fwd / flash_bwd --------------------------------------------------------


@torch.library.custom_op("attnkit::flash_fwd", mutates_args=())
def _flash_fwd(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, left: int | None, right: int | None,
    scale: float, softcap: float | None, alibi_slopes: Tensor | None,
) -> tuple[Tensor, Tensor]:
    return _flash.flash_attention_forward(
        q, k, v, causal=causal, window=_window(left, right), scale=scale, softcap=softcap,
        alibi_slopes=alibi_slopes,
    )


@_flash_fwd.register_fake
def _flash_fwd_fake(q, k, v, causal, left, right, scale, softcap, alibi_slopes):  # type: ignore[no-untyped-def]
    check_qkv(q, k, v, batched=True)
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[-1])), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("attnkit::flash_bwd", mutates_args=())
def _flash_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    dlse: Tensor | None, causal: bool, left: int | None, right: int | None, scale: float,
    softcap: float | None, alibi_slopes: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    return _flash.flash_attention_backward(
        dout, q, k, v, out, lse, causal=causal, window=_window(left, right), scale=scale,
        softcap=softcap, alibi_slopes=alibi_slopes, dlse=dlse,
    )


@_flash_bwd.register_fake
def _flash_bwd_fake(dout, q, k, v, out, lse, dlse, causal, left, right, scale, softcap,  # type: ignore[no-untyped-def]
                    alibi_slopes):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _flash_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    q, k, v, causal, left, right, scale, softcap, alibi_slopes = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.options = (causal, left, right, scale, softcap)


def _flash_backward(ctx, dout, dlse):  # type: ignore[no-untyped-def]
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    causal, left, right, scale, softcap = ctx.options
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _flash_bwd(dout, q, k, v, out, lse, dlse, causal, left, right, scale,
                            softcap, alibi_slopes)
    return dq, dk, dv, None, None, None, None, None, None


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
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_len: int, scale: float,
    num_splits: int | None,
) -> tuple[Tensor, Tensor]:
    return _decode.decode_attention(q, k_cache, v_cache, cache_len, scale=scale,
                                    return_lse=True, num_splits=num_splits)


@_decode_op.register_fake
def _decode_fake(q, k_cache, v_cache, cache_len, scale, num_splits):  # type: ignore[no-untyped-def]
    check_qkv(q, k_cache, v_cache, batched=True)
    B, H, Tq, _ = q.shape
    return (q.new_empty((B, H, Tq, v_cache.shape[-1])),
            q.new_empty((B, H, Tq), dtype=torch.float32))


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


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Fused attention with autograd: ``softmax(scale * q k^T [+ features]) v``.

    Args:
        q: ``(B, H, Tq, Dk)``, float16/bfloat16 (float32 for testing).
        k: ``(B, Hkv, Tk, Dk)``; GQA/MQA when ``Hkv < H`` (K/V never expanded).
        v: ``(B, Hkv, Tk, Dv)``.
        causal: bottom-right aligned: query ``i`` sees key ``j`` iff ``j <= i + Tk - Tq``.
        window: ``(left, right)``: key ``j`` allowed iff ``diag - left <= j <= diag +
            right`` with ``diag = i + Tk - Tq``; None (whole or per side) = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: Gemma-2 style ``softcap * tanh(s / softcap)`` on the scaled scores.
        alibi_slopes: ``(H,)`` or ``(B, H)`` float; adds ``-slope * |i + Tk - Tq - j|``
            to the (capped) scores (FlashAttention's convention; not differentiated).
        return_lse: also return the natural-log LSE ``(B, H, Tq)``, float32.

    Returns:
        ``out (B, H, Tq, Dv)``, or ``(out, lse)``. Rows with no allowed key: 0 and -inf.
        The kernels have no double backward (differentiating twice raises).
    """
    left, right, s = _options(q, window, scale)
    out, lse = _flash_fwd(q, k, v, bool(causal), left, right, s, softcap, alibi_slopes)
    return (out, lse) if return_lse else out


def flash_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Fused attention forward, no autograd: ``(out (B, H, Tq, Dv), lse (B, H, Tq))``.
    Arguments as :func:`flash_attention` (see :func:`attnkit.triton.flash.
    flash_attention_forward`, the launcher behind the op)."""
    left, right, s = _options(q, window, scale)
    with torch.no_grad():
        return _flash_fwd(q, k, v, bool(causal), left, right, s, softcap, alibi_slopes)


def flash_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Tensor | None = None,
    dlse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused attention backward, no autograd: ``(dq, dk, dv)`` from the forward's ``out``
    and ``lse`` (and an optional ``dlse``). See :func:`attnkit.triton.flash.
    flash_attention_backward`, the launcher behind the op."""
    left, right, s = _options(q, window, scale)
    return _flash_bwd(dout, q, k, v, out, lse, dlse, bool(causal), left, right, s, softcap,
                      alibi_slopes)


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_len: int,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    num_splits: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of ``Tq`` new queries over the first ``cache_len`` positions of a KV
    cache, read in place (bottom-right causal among them). See
    :func:`attnkit.triton.decode.decode_attention`, the launcher behind the op.

    Returns:
        ``out (B, H, Tq, Dv)`` in q's dtype, or ``(out, lse)``.
    """
    try:
        cache_len = operator.index(cache_len)
    except TypeError:
        raise TypeError(f"cache_len must be an int, got {type(cache_len).__name__}") from None
    _, _, s = _options(q, None, scale)
    out, lse = _decode_op(q, k_cache, v_cache, cache_len, s, num_splits)
    return (out, lse) if return_lse else out
