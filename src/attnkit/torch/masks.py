"""Masks, one meaning everywhere: **True = may attend** (as SDPA, JAX and Keras read it).

Every constraint :func:`attnkit.torch.attention` accepts (``mask``, ``valid_lens``,
``causal``, ``window``, ``segment_ids``) becomes a boolean tensor broadcastable to the scores
``(..., Tq, Tk)``, and the constraints are ANDed. Masked scores become ``-inf`` (or are
selected away) and a row left with no allowed key gets weights 0, so no large-negative
fill constant appears anywhere and half precision cannot overflow. Nothing here writes
into a caller's tensor.

Causal and window masks are aligned to the bottom-right diagonal, so that the last ``Tq``
queries of a sequence whose ``Tk`` keys sit in a KV cache see what they should;
``causal="top_left"`` is SDPA's ``is_causal`` (``j <= i``), and the window stays
bottom-right aligned with it::

    causal, Tq=2, Tk=4 (1 = keep)      causal="top_left"      window=(1, 0), Tq=Tk=4
        1 1 1 0                            1 0 0 0                1 0 0 0
        1 1 1 1                            1 1 0 0                1 1 0 0
                                                                  0 1 1 0
                                                                  0 0 1 1

``segment_ids`` (packed documents, left/right padding): query ``i`` may attend key ``j``
only if their ids are equal; an id < 0 attends and is attended by nothing. The helpers
:func:`segment_ids_from_padding_mask`, :func:`segment_ids_from_lengths` and
:func:`segment_ids_from_cu_seqlens` build them.

``torch.nn.MultiheadAttention`` uses the opposite convention (True = ignore) for its bool
``attn_mask`` and ``key_padding_mask``; :func:`from_key_padding_mask` and
:func:`from_attn_mask` convert by name so nobody flips a boolean by hand.
"""

from __future__ import annotations

import functools
import numbers

import torch

# Shape and argument rules are attnkit.spec's: one definition, and the same messages, for
# arrays and tensors.
from ..spec import (
    Window,
    check_broadcast,
    check_causal,
    check_length_range,
    check_segment_ids,
    check_window_side,
    resolve_band,
)
from ._checks import check_mask, valid_lens_view
from .softmax import safe_softmax

__all__ = [
    "Window",
    "attention_mask",
    "causal_mask",
    "combine_masks",
    "lengths_mask",
    "from_attn_mask",
    "from_key_padding_mask",
    "masked_softmax",
    "positions_of",
    "segment_ids_from_cu_seqlens",
    "segment_ids_from_lengths",
    "segment_ids_from_padding_mask",
    "segment_mask",
    "sequence_mask",
    "valid_lens_limits",
    "valid_lens_mask",
    "window_mask",
]


def _on_host(x: torch.Tensor) -> bool:
    """Whether ``x``'s values may be read here: a CPU tensor (no device to wait for) and no
    ``torch.compile`` trace (a read would break the graph)."""
    return x.is_cpu and not torch.compiler.is_compiling()


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _number(x: float) -> int | float:
    """``x`` as it reads best in a message: an int when whole (``3``, not ``3.0``)."""
    return int(x) if float(x).is_integer() else x


def _check_lengths(valid_lens: object, maxlen: int) -> torch.Tensor:
    """Integer lengths in ``[0, maxlen]`` (integral floats accepted, as d2l passes them).

    On the CPU the values are read and checked: ``ValueError`` naming min and max (``inf``
    by name), ``TypeError`` for fractions. On a GPU, or while ``torch.compile`` traces,
    they are clamped to ``[0, maxlen]`` by tensor ops instead: a device-side assert would
    leave the CUDA context unusable, and a read-back would stall the stream."""
    vl = valid_lens if isinstance(valid_lens, torch.Tensor) else torch.as_tensor(valid_lens)
    if vl.ndim == 1 and vl.dtype in _INTEGER_DTYPES and _on_host(vl):
        # The decoding step's form, (B,) integers on the CPU: read and checked in one go.
        values = vl.tolist()
        if values and (min(values) < 0 or max(values) > maxlen):
            check_length_range(min(values), max(values), maxlen)
        return vl
    if vl.dtype == torch.bool or vl.is_complex():
        raise TypeError(f"valid_lens must hold integers, got dtype {vl.dtype}")
    if not _on_host(vl):
        if vl.is_floating_point():
            vl = torch.nan_to_num(vl, 0.0).clamp_(0, maxlen).long()
            return vl
        return vl.clamp(0, maxlen)
    if not vl.numel():
        return vl.long() if vl.is_floating_point() else vl
    if not vl.is_floating_point():
        # On the host (no device sync); a short list is cheaper to read than aminmax.
        values = vl.flatten().tolist() if vl.numel() <= 4096 else \
            torch.stack(torch.aminmax(vl.flatten())).tolist()
        lo, hi = min(values), max(values)
        if lo < 0 or hi > maxlen:
            check_length_range(lo, hi, maxlen)
    else:
        values = vl.flatten().tolist()
        if any(x != x for x in values):  # NaN
            raise TypeError(f"valid_lens must hold whole numbers, got {vl.tolist()}")
        check_length_range(_number(min(values)), _number(max(values)), maxlen)
        if not all(float(x).is_integer() for x in values):
            raise TypeError(f"valid_lens must hold whole numbers, got {vl.tolist()}")
    return vl.long() if vl.is_floating_point() else vl


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


def valid_lens_limits(valid_lens: torch.Tensor, scores_shape: tuple[int, ...]) -> torch.Tensor:
    """d2l ``valid_lens`` as key counts broadcastable to ``scores_shape = (B, ..., Tq, Tk)``
    with its key axis 1: ``(B, 1, ..., 1, 1)`` for ``(B,)``, ``(B, 1, ..., Tq, 1)`` for
    ``(B, Tq)``. Key ``j`` is valid for a query iff ``j < count``."""
    shape = tuple(scores_shape)
    if not isinstance(valid_lens, torch.Tensor):
        valid_lens = torch.as_tensor(valid_lens)
    view = valid_lens_view(tuple(valid_lens.shape), shape)
    return _check_lengths(valid_lens, shape[-1]).reshape(view)


def lengths_mask(
    valid_lens: torch.Tensor, view: tuple[int, ...], positions: torch.Tensor
) -> torch.Tensor:
    """``valid_lens`` (a tensor whose shape :func:`valid_lens_view` turned into ``view``)
    as a bool key mask against ``positions = arange(Tk)`` on their device: their values
    checked (or clamped off the host), then one compare."""
    return positions < _check_lengths(valid_lens, positions.shape[0]).view(view)


@functools.lru_cache(maxsize=64)
def positions_of(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` on ``device``, made once per length (a decoding step would otherwise
    allocate it per layer); never written to."""
    return torch.arange(n, device=device)


def valid_lens_mask(valid_lens: torch.Tensor, scores_shape: tuple[int, ...]) -> torch.Tensor:
    """d2l ``valid_lens`` as a bool mask broadcastable to ``scores_shape = (B, ..., Tq, Tk)``.

    ``(B,)``: one length per batch row, for every query and head. ``(B, Tq)``: one length
    per query.
    """
    limits = valid_lens_limits(valid_lens, scores_shape)
    return positions_of(scores_shape[-1], limits.device) < limits


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
    # j - d for each query i (rows) and key j (columns), d = i + Tk - Tq its diagonal key
    off = torch.arange(Tq - Tk, Tq, device=device) - torch.arange(Tq, device=device)[:, None]
    if left is None and right is None:
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if left is None:
        return off <= right
    if right is None:
        return off >= -left
    return (off >= -left) & (off <= right)


def causal_mask(
    Tq: int, Tk: int, *, alignment: str = "bottom_right",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``(Tq, Tk)`` bool. ``"bottom_right"``: query ``i`` sees key ``j`` iff
    ``j <= i + Tk - Tq``; ``"top_left"`` (SDPA's ``is_causal``): iff ``j <= i``."""
    edge = Tq - Tk if check_causal(alignment) == "top_left" else 0  # j <= diag + edge
    return window_mask(Tq, Tk, None, edge, device=device)


def segment_mask(segment_ids: object, scores_shape: tuple[int, ...]) -> torch.Tensor:
    """``segment_ids`` as a bool mask ``(B, 1, ..., Tq, Tk)`` broadcastable to scores
    ``(B, ..., Tq, Tk)``: True iff the query's and the key's ids are equal and not < 0.

    Args:
        segment_ids: integer ``(B, T)`` (self-attention) or a pair ``(q_ids (B, Tq),
            kv_ids (B, Tk))``, on one device (the mask's).
        scores_shape: the scores' shape.
    """
    pair = check_segment_ids(segment_ids, scores_shape)
    assert pair is not None
    q_ids, kv_ids = pair
    same = (q_ids[:, :, None] == kv_ids[:, None, :]) & (q_ids[:, :, None] >= 0)  # (B, Tq, Tk)
    return same.reshape(same.shape[:1] + (1,) * (len(scores_shape) - 3) + same.shape[1:])


def segment_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Segment ids of packed documents given by cumulative lengths (flash-attn's
    ``cu_seqlens``): document ``d`` fills ``[cu[d], cu[d+1])`` and gets id ``d``; positions
    from ``cu[-1]`` to ``total`` are padding (-1). The bounds are checked on the CPU; on a
    GPU they are not (a check would stall the stream or poison the context).

    Args:
        cu_seqlens: integer ``(N+1,)`` or ``(B, N+1)``, ``[0, ..., <= total]``.
        total: the packed length ``T``.

    Returns:
        int64 ``(1, total)`` (from 1-D ``cu_seqlens``) or ``(B, total)``, on its device.
    """
    cu = torch.as_tensor(cu_seqlens)
    if cu.ndim not in (1, 2) or cu.shape[-1] < 1:
        raise ValueError(f"cu_seqlens must have shape (N+1,) or (B, N+1), got {tuple(cu.shape)}")
    if cu.is_floating_point() or cu.dtype == torch.bool or cu.is_complex():
        raise TypeError(f"cu_seqlens must hold integers, got dtype {cu.dtype}")
    cu = cu.reshape(-1, cu.shape[-1]).long()
    if _on_host(cu) and bool(
            (cu[:, 0] != 0).any() | (cu.diff(dim=-1) < 0).any() | (cu[:, -1] > total).any()):
        raise ValueError(f"cu_seqlens must start at 0, never decrease and end at most at "
                         f"total={total}, got {cu.tolist()}")
    pos = torch.arange(int(total), device=cu.device).expand(cu.shape[0], -1).contiguous()
    ids = torch.searchsorted(cu[:, 1:].contiguous(), pos, right=True)
    return torch.where(pos < cu[:, -1:], ids, -1)


def segment_ids_from_lengths(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Segment ids of documents of ``lengths`` packed one after another into ``total``
    positions (the rest padding, -1).

    Args:
        lengths: non-negative integers ``(N,)`` or ``(B, N)``, summing to at most ``total``.
        total: the packed length ``T``.

    Returns:
        int64 ``(1, total)`` (from 1-D ``lengths``) or ``(B, total)``, on its device.
    """
    n = torch.as_tensor(lengths)
    if n.is_floating_point() or n.dtype == torch.bool or n.ndim not in (1, 2):
        raise TypeError(
            f"lengths must be integers of shape (N,) or (B, N), got {n.dtype} {tuple(n.shape)}"
        )
    if _on_host(n) and bool((n < 0).any() | (n.sum(dim=-1) > total).any()):
        raise ValueError(f"lengths must be >= 0 and sum to at most total={total}, got "
                         f"{n.tolist()}")
    cu = torch.nn.functional.pad(n.long().cumsum(dim=-1), (1, 0))
    return segment_ids_from_cu_seqlens(cu, total)


def segment_ids_from_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """Segment ids ``(B, T)`` from a padding mask ``(B, T)`` with 1 (or True) = real token:
    real tokens get id 0, padding -1, wherever it sits (left, right or between). For
    ``nn.MultiheadAttention``'s ``key_padding_mask`` (True = ignore) pass its negation.

    Returns:
        int64 ``(B, T)`` on the mask's device.
    """
    m = torch.as_tensor(mask)
    if m.ndim != 2:
        raise ValueError(f"padding mask must be (B, T), got {tuple(m.shape)}")
    if m.is_floating_point() or m.is_complex():
        raise TypeError(f"padding mask must hold 0/1 or bools (1 = real token), got {m.dtype}")
    if m.dtype != torch.bool and _on_host(m) and bool(((m != 0) & (m != 1)).any()):
        raise ValueError(f"padding mask must hold only 0 and 1 (1 = real token), got "
                         f"{m.tolist()}")
    return torch.where(m.bool(), 0, -1).long()


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
    causal: bool | str = False,
    window: Window | None = None,
    segment_ids: object = None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """AND of every given constraint, a bool tensor broadcastable to ``scores_shape``.

    ``causal``: True or ``"bottom_right"``, or ``"top_left"``; ``segment_ids``: see
    :func:`segment_mask`.

    Returns None when nothing is masked, so callers can skip the work. The result has the
    smallest shape that carries the constraints (a key-padding mask stays ``(B, 1, 1, Tk)``).
    """
    shape = tuple(scores_shape)
    if mask is not None:
        check_mask(mask, shape)
    return combine_masks(shape, mask=mask, valid_lens=valid_lens,
                         band=resolve_band(causal, window, shape[-2], shape[-1]),
                         segment_ids=check_segment_ids(segment_ids, shape), device=device)


def combine_masks(
    shape: tuple[int, ...],
    *,
    mask: torch.Tensor | None,
    valid_lens: torch.Tensor | None,
    band: tuple[int | None, int | None],
    segment_ids: tuple[torch.Tensor, torch.Tensor] | None,
    device: torch.device | str | None,
) -> torch.Tensor | None:
    """The AND of constraints whose structure is already checked: :func:`attention_mask`
    without its checks, for :func:`attnkit.torch.attention`, which checks the structure
    once per call signature. ``mask`` broadcasts to ``shape``; ``valid_lens`` values are
    still checked here (values are never cached); ``band = (left, right)`` is resolved;
    ``segment_ids`` is the ``(q_ids, kv_ids)`` pair. None when nothing is masked."""
    Tq, Tk = shape[-2], shape[-1]
    allowed: torch.Tensor | None = None

    def _and(m: torch.Tensor) -> None:
        nonlocal allowed
        allowed = m if allowed is None else (allowed & m)

    if mask is not None:
        _and(mask if device is None or mask.device == device else mask.to(device))
    if valid_lens is not None:
        vm = valid_lens_mask(valid_lens, shape)
        _and(vm if device is None or vm.device == device else vm.to(device))
    left, right = band  # causal and window: one band
    if left is not None or right is not None:
        _and(window_mask(Tq, Tk, left, right, device=device))
    if segment_ids is not None:
        sm = segment_mask(segment_ids, shape)
        _and(sm.to(device) if device is not None else sm)
    return allowed


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
