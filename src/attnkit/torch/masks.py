"""Masks, one meaning everywhere: **True = may attend** (as SDPA, JAX and Keras read it).

Every constraint :func:`attnkit.torch.attention` accepts (``mask``, ``valid_lens``,
``causal``, ``window``) becomes a boolean tensor broadcastable to the scores
``(..., Tq, Tk)``, and the constraints are ANDed. Masked scores become ``-inf`` and rows
left with no allowed key are guarded explicitly, so no large-negative fill constant
appears anywhere and half precision cannot overflow. Nothing here writes into a caller's
tensor.

Causal and window masks are aligned to the bottom-right diagonal, so that the last ``Tq``
queries of a sequence whose ``Tk`` keys sit in a KV cache see what they should::

    causal, Tq=2, Tk=4 (1 = keep)      window=(1, 0), Tq=Tk=4
        1 1 1 0                            1 0 0 0
        1 1 1 1                            1 1 0 0
                                           0 1 1 0
                                           0 0 1 1

``torch.nn.MultiheadAttention`` uses the opposite convention (True = ignore) for its bool
``attn_mask`` and ``key_padding_mask``; :func:`from_key_padding_mask` and
:func:`from_attn_mask` convert by name so nobody flips a boolean by hand.
"""

from __future__ import annotations

import numbers

import torch

# Shape and argument rules are attnkit.spec's: one definition, and the same messages, for
# arrays and tensors.
from ..spec import (
    Window,
    check_broadcast,
    check_length_range,
    check_window,
    check_window_side,
)
from .softmax import safe_softmax

__all__ = [
    "Window",
    "attention_mask",
    "causal_mask",
    "from_attn_mask",
    "from_key_padding_mask",
    "masked_softmax",
    "sequence_mask",
    "valid_lens_mask",
    "window_mask",
]


def _check_lengths(valid_lens: torch.Tensor, maxlen: int) -> torch.Tensor:
    """Integer lengths in ``[0, maxlen]`` (integral floats accepted, as d2l passes them)."""
    if not isinstance(valid_lens, torch.Tensor):
        valid_lens = torch.as_tensor(valid_lens)
    if valid_lens.dtype == torch.bool or valid_lens.is_complex():
        raise TypeError(f"valid_lens must hold integers, got dtype {valid_lens.dtype}")
    if valid_lens.is_floating_point():
        if not bool(torch.all(valid_lens == torch.round(valid_lens))):
            raise TypeError(f"valid_lens must hold whole numbers, got {valid_lens.tolist()}")
        valid_lens = valid_lens.long()
    if valid_lens.numel():
        check_length_range(int(valid_lens.min()), int(valid_lens.max()), maxlen)
    return valid_lens


def sequence_mask(valid_lens: torch.Tensor, maxlen: int) -> torch.Tensor:
    """Boolean mask, True where ``position < valid_len``.

    Args:
        valid_lens: integer lengths ``(B,)`` or ``(B, Tq)``, each in ``[0, maxlen]``.
        maxlen: the padded length ``Tk``.

    Returns:
        bool tensor ``valid_lens.shape + (maxlen,)`` on ``valid_lens``' device.
    """
    if not isinstance(maxlen, numbers.Integral) or maxlen < 0:
        raise ValueError(f"maxlen must be a non-negative integer, got {maxlen!r}")
    vl = _check_lengths(valid_lens, int(maxlen))
    if vl.ndim not in (1, 2):
        raise ValueError(f"valid_lens must have shape (B,) or (B, Tq), got {tuple(vl.shape)}")
    return torch.arange(int(maxlen), device=vl.device) < vl[..., None]


def valid_lens_mask(valid_lens: torch.Tensor, scores_shape: tuple[int, ...]) -> torch.Tensor:
    """d2l ``valid_lens`` as a bool mask broadcastable to ``scores_shape = (B, ..., Tq, Tk)``.

    ``(B,)``: one length per batch row, for every query and head. ``(B, Tq)``: one length
    per query.
    """
    shape = tuple(scores_shape)
    if not isinstance(valid_lens, torch.Tensor):
        valid_lens = torch.as_tensor(valid_lens)
    if len(shape) < 3:
        raise ValueError(
            f"valid_lens needs scores with a batch axis (B, ..., Tq, Tk), got scores {shape}"
        )
    B, Tq, Tk = shape[0], shape[-2], shape[-1]
    vl = tuple(valid_lens.shape)
    if vl == (B,):
        view = (B,) + (1,) * (len(shape) - 2)
    elif vl == (B, Tq):
        view = (B,) + (1,) * (len(shape) - 3) + (Tq,)
    else:
        raise ValueError(
            f"valid_lens of shape {vl} does not fit scores of shape {shape}: expected "
            f"(B,) = ({B},) or (B, Tq) = ({B}, {Tq})"
        )
    return sequence_mask(valid_lens.reshape(-1), Tk).reshape(view + (Tk,))


def window_mask(
    Tq: int,
    Tk: int,
    left: int | None,
    right: int | None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``(Tq, Tk)`` bool sliding window around the bottom-right diagonal.

    Key ``j`` is allowed for query ``i`` iff ``d - left <= j <= d + right`` with
    ``d = i + Tk - Tq``; ``None`` leaves that side unbounded.
    """
    check_window_side("left", left)
    check_window_side("right", right)
    i = torch.arange(Tq, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    d = i + (Tk - Tq)  # the diagonal key of each query
    keep = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if left is not None:
        keep = keep & (j >= d - left)
    if right is not None:
        keep = keep & (j <= d + right)
    return keep


def causal_mask(Tq: int, Tk: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``(Tq, Tk)`` bool, bottom-right aligned: query ``i`` sees key ``j`` iff
    ``j <= i + Tk - Tq``."""
    return window_mask(Tq, Tk, None, 0, device=device)


def from_key_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention``'s ``key_padding_mask`` (bool ``(B, Tk)``, True = ignore)
    as an attnkit mask (True = may attend) of shape ``(B, 1, 1, Tk)``.

    The result broadcasts against scores ``(B, H, Tq, Tk)``.
    """
    kpm = key_padding_mask
    if not isinstance(kpm, torch.Tensor) or kpm.dtype != torch.bool:
        raise TypeError(
            "key_padding_mask must be a bool tensor (True = ignore); got "
            f"{getattr(kpm, 'dtype', type(kpm))}. A float padding mask is additive: pass it "
            "as `bias` reshaped to (B, 1, 1, Tk)"
        )
    if kpm.ndim != 2:
        raise ValueError(f"key_padding_mask must be (B, Tk), got {tuple(kpm.shape)}")
    return ~kpm[:, None, None, :]


def from_attn_mask(attn_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``nn.MultiheadAttention``'s ``attn_mask`` as attnkit keyword arguments.

    A bool ``attn_mask`` (True = NOT allowed) becomes ``{"mask": ~attn_mask}``; a float one
    (added to the scores) becomes ``{"bias": attn_mask}``. ``(Tq, Tk)`` masks are kept;
    ``(B*H, Tq, Tk)`` masks must first be reshaped to ``(B, H, Tq, Tk)`` by the caller
    (the batch/head split is not recoverable from the shape alone).
    """
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(attn_mask)}")
    if attn_mask.dtype == torch.bool:
        return {"mask": ~attn_mask}
    if attn_mask.is_floating_point():
        return {"bias": attn_mask}
    raise TypeError(f"attn_mask must be bool or float, got dtype {attn_mask.dtype}")


def attention_mask(
    scores_shape: tuple[int, ...],
    *,
    mask: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: Window | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """AND of every given constraint, a bool tensor broadcastable to ``scores_shape``.

    Returns None when nothing is masked, so callers can skip the work. The result has the
    smallest shape that carries the constraints (a key-padding mask stays ``(B, 1, 1, Tk)``).
    """
    shape = tuple(scores_shape)
    Tq, Tk = shape[-2], shape[-1]
    keep: torch.Tensor | None = None

    def _and(m: torch.Tensor) -> None:
        nonlocal keep
        keep = m if keep is None else (keep & m)

    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be a bool tensor (True = may attend), got "
                f"{getattr(mask, 'dtype', type(mask))}; pass additive float values as `bias`"
            )
        check_broadcast("mask", tuple(mask.shape), shape)
        _and(mask.to(device) if device is not None else mask)
    if valid_lens is not None:
        vm = valid_lens_mask(valid_lens, shape)
        _and(vm.to(device) if device is not None else vm)
    if causal:
        _and(causal_mask(Tq, Tk, device=device))
    win = check_window(window)
    if win is not None:
        _and(window_mask(Tq, Tk, win[0], win[1], device=device))
    return keep


def masked_softmax(
    scores: torch.Tensor,
    valid_lens: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax over the last axis, restricted to allowed keys (d2l's signature).

    Unlike d2l's version this never writes into ``scores`` and uses no large-negative fill:
    masked entries get weight exactly 0, and a row with no allowed key (``valid_len == 0``)
    gets all zeros instead of a silent uniform distribution. Half-precision input is
    normalised in float32.

    Args:
        scores: ``(B, ..., Tq, Tk)``; any shape when only ``mask`` is given.
        valid_lens: ``(B,)`` or ``(B, Tq)``; keys ``j < valid_len`` are valid.
        mask: bool, True = keep, broadcastable to ``scores``.

    Returns:
        Weights of ``scores``' shape and dtype.
    """
    keep: torch.Tensor | None = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = keep), got {mask!r:.60}")
        check_broadcast("mask", tuple(mask.shape), tuple(scores.shape))
        keep = mask
    if valid_lens is not None:
        vm = valid_lens_mask(valid_lens, tuple(scores.shape)).to(scores.device)
        keep = vm if keep is None else keep & vm
    return safe_softmax(scores, keep).to(scores.dtype)
