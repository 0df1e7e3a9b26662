"""Masks, one meaning everywhere: **True = may attend**.

Every constraint an op accepts (``mask``, ``valid_lens``, ``causal``, ``window``,
``segment_ids``) is turned into a boolean array broadcastable to the scores
``(..., Tq, Tk)``, and the constraints are ANDed. Masked scores become ``-inf``; rows with
no allowed key are guarded by the softmax and give exact zeros. No magic fill constants,
no writes into the caller's arrays.

Causal and window masks are aligned to the bottom-right diagonal, so that a query block at
the end of a longer key sequence (a KV cache) sees what it should; ``causal="top_left"``
is PyTorch SDPA's and JAX's ``is_causal`` (``j <= i``). The window stays bottom-right
aligned either way::

    causal, Tq=2, Tk=4 (1 = keep)      causal="top_left"      window=(1, 0), Tq=Tk=4
        1 1 1 0                            1 0 0 0                1 0 0 0
        1 1 1 1                            1 1 0 0                1 1 0 0
                                                                  0 1 1 0
                                                                  0 0 1 1

``segment_ids`` (packed documents, padding): query ``i`` may attend key ``j`` only if their
ids are equal, and an id < 0 (padding) attends and is attended by nothing::

    q_ids = kv_ids = [0, 0, 1, 1, -1]
        1 1 0 0 0
        1 1 0 0 0
        0 0 1 1 0
        0 0 1 1 0
        0 0 0 0 0
"""

from __future__ import annotations

import numbers

import numpy as np

from ..spec import (
    Window,
    check_broadcast,
    check_causal,
    check_length_range,
    check_segment_ids,
    check_window,
    check_window_side,
)
from .softmax import softmax, softmax_backward

__all__ = [
    "attention_mask",
    "causal_mask",
    "masked_softmax",
    "segment_ids_from_cu_seqlens",
    "segment_ids_from_lengths",
    "segment_ids_from_padding_mask",
    "segment_mask",
    "sequence_mask",
    "valid_lens_mask",
    "window_mask",
]


def _as_lengths(valid_lens: np.ndarray, maxlen: int) -> np.ndarray:
    """Validate lengths: integers (or integral floats) in ``[0, maxlen]``."""
    vl = np.asarray(valid_lens)
    if vl.dtype == np.bool_ or not (
        np.issubdtype(vl.dtype, np.integer) or np.issubdtype(vl.dtype, np.floating)
    ):
        raise TypeError(f"valid_lens must hold integers, got dtype {vl.dtype}")
    if np.issubdtype(vl.dtype, np.floating):
        if not np.all(np.isfinite(vl)) or np.any(vl != np.round(vl)):
            raise TypeError(f"valid_lens must hold whole numbers, got {vl.tolist()}")
        vl = vl.astype(np.int64)
    if vl.size:
        check_length_range(int(vl.min()), int(vl.max()), maxlen)
    return vl


def sequence_mask(valid_lens: np.ndarray, maxlen: int) -> np.ndarray:
    """Boolean mask, True where ``position < valid_len``.

    Args:
        valid_lens: integer lengths of shape ``(B,)`` or ``(B, Tq)``, each in ``[0, maxlen]``.
        maxlen: the padded length ``Tk``.

    Returns:
        bool array of shape ``valid_lens.shape + (maxlen,)``.
    """
    if not isinstance(maxlen, numbers.Integral) or maxlen < 0:
        raise ValueError(f"maxlen must be a non-negative integer, got {maxlen!r}")
    vl = _as_lengths(valid_lens, int(maxlen))
    if vl.ndim not in (1, 2):
        raise ValueError(f"valid_lens must have shape (B,) or (B, Tq), got {vl.shape}")
    return np.arange(maxlen) < vl[..., None]


def valid_lens_mask(valid_lens: np.ndarray, scores_shape: tuple[int, ...]) -> np.ndarray:
    """d2l ``valid_lens`` as a bool mask broadcastable to ``scores_shape = (B, ..., Tq, Tk)``.

    1-D ``(B,)``: one length per batch row, for every query (and every head).
    2-D ``(B, Tq)``: one length per query.
    """
    shape = tuple(scores_shape)
    vl = np.asarray(valid_lens)
    if len(shape) < 2:
        raise ValueError(f"valid_lens needs scores with a batch axis, got scores {shape}")
    B, Tk = shape[0], shape[-1]
    if vl.ndim == 1 and vl.shape[0] == B:
        lens = vl.reshape((B,) + (1,) * (len(shape) - 2))
    elif vl.ndim == 2 and len(shape) >= 3 and vl.shape == (B, shape[-2]):
        lens = vl.reshape((B,) + (1,) * (len(shape) - 3) + (shape[-2],))
    else:
        raise ValueError(
            f"valid_lens of shape {vl.shape} does not fit scores of shape {shape}: expected "
            f"(B,) = ({B},) or (B, Tq) = ({B}, {shape[-2]})"
        )
    return sequence_mask(lens.reshape(-1), Tk).reshape(lens.shape + (Tk,))


def causal_mask(Tq: int, Tk: int, alignment: str = "bottom_right") -> np.ndarray:
    """``(Tq, Tk)`` bool. ``"bottom_right"``: query ``i`` sees key ``j`` iff
    ``j <= i + Tk - Tq``; ``"top_left"``: iff ``j <= i``."""
    if check_causal(alignment) == "top_left":
        return window_mask(Tq, Tk, None, Tq - Tk)  # j <= i is j <= diag - (Tk - Tq)
    return window_mask(Tq, Tk, None, 0)


def window_mask(Tq: int, Tk: int, left: int | None, right: int | None) -> np.ndarray:
    """``(Tq, Tk)`` bool sliding window around the bottom-right diagonal.

    Key ``j`` is allowed for query ``i`` iff ``d - left <= j <= d + right`` with
    ``d = i + Tk - Tq``; ``None`` leaves that side unbounded.
    """
    check_window_side("left", left)
    check_window_side("right", right)
    i = np.arange(Tq)[:, None]
    j = np.arange(Tk)[None, :]
    d = i + (Tk - Tq)
    keep = np.ones((Tq, Tk), dtype=bool)
    if left is not None:
        keep &= j >= d - left
    if right is not None:
        keep &= j <= d + right
    return keep


def segment_mask(segment_ids: object, scores_shape: tuple[int, ...]) -> np.ndarray:
    """``segment_ids`` as a bool mask ``(B, 1, ..., Tq, Tk)`` broadcastable to scores
    ``(B, ..., Tq, Tk)``: True iff the query's and the key's ids are equal and not < 0.

    Args:
        segment_ids: integer ``(B, T)`` (self-attention, ``Tq == Tk``) or a pair
            ``(q_ids (B, Tq), kv_ids (B, Tk))``.
        scores_shape: the scores' shape.
    """
    pair = check_segment_ids(segment_ids, scores_shape)
    assert pair is not None
    q_ids, kv_ids = (np.asarray(x) for x in pair)
    keep = (q_ids[:, :, None] == kv_ids[:, None, :]) & (q_ids[:, :, None] >= 0)  # (B, Tq, Tk)
    return keep.reshape((keep.shape[0],) + (1,) * (len(scores_shape) - 3) + keep.shape[1:])


def _ids_from_bounds(cu: np.ndarray, total: int) -> np.ndarray:
    """Document ids ``(total,)`` of one row of starts ``cu = [0, c1, ..., cN]``: position
    ``t`` is in document ``d`` iff ``cu[d] <= t < cu[d+1]``; past ``cu[N]`` it is -1."""
    ids = np.searchsorted(cu[1:], np.arange(total), side="right")
    return np.where(np.arange(total) < cu[-1], ids, -1).astype(np.int64)


def _check_bounds(cu: np.ndarray, total: int, what: str) -> None:
    if cu.ndim not in (1, 2) or cu.shape[-1] < 1:
        raise ValueError(f"{what} must have shape (N+1,) or (B, N+1), got {cu.shape}")
    if not np.issubdtype(cu.dtype, np.integer):
        raise TypeError(f"{what} must hold integers, got dtype {cu.dtype}")
    if np.any(cu[..., 0] != 0) or np.any(np.diff(cu, axis=-1) < 0) or np.any(cu[..., -1] > total):
        raise ValueError(
            f"{what} must start at 0, never decrease and end at most at total={total}, got "
            f"{cu.tolist()}"
        )


def segment_ids_from_cu_seqlens(cu_seqlens: np.ndarray, total: int) -> np.ndarray:
    """Segment ids of packed documents given by their cumulative lengths (flash-attn's
    ``cu_seqlens``): document ``d`` fills positions ``[cu[d], cu[d+1])`` and gets id ``d``;
    positions from ``cu[-1]`` to ``total`` are padding (-1).

    Args:
        cu_seqlens: integer ``(N+1,)`` or ``(B, N+1)``, ``[0, ..., <= total]``.
        total: the packed length ``T``.

    Returns:
        int64 ``(1, total)`` (from 1-D ``cu_seqlens``) or ``(B, total)``.
    """
    cu = np.asarray(cu_seqlens)
    _check_bounds(cu, total, "cu_seqlens")
    rows = cu.reshape(-1, cu.shape[-1])
    return np.stack([_ids_from_bounds(row, int(total)) for row in rows])


def segment_ids_from_lengths(lengths: np.ndarray, total: int) -> np.ndarray:
    """Segment ids of documents of ``lengths`` packed one after another into ``total``
    positions (the rest padding, -1): :func:`segment_ids_from_cu_seqlens` of their running
    sum.

    Args:
        lengths: non-negative integers ``(N,)`` or ``(B, N)``, summing to at most ``total``.
        total: the packed length ``T``.

    Returns:
        int64 ``(1, total)`` (from 1-D ``lengths``) or ``(B, total)``.
    """
    n = np.asarray(lengths)
    if not np.issubdtype(n.dtype, np.integer) or n.ndim not in (1, 2):
        raise TypeError(
            f"lengths must be integers of shape (N,) or (B, N), got {n.dtype} {n.shape}"
        )
    if np.any(n < 0) or np.any(n.sum(axis=-1) > total):
        raise ValueError(
            f"lengths must be >= 0 and sum to at most total={total}, got {n.tolist()}"
        )
    zero = np.zeros(n.shape[:-1] + (1,), dtype=n.dtype)
    return segment_ids_from_cu_seqlens(np.concatenate([zero, np.cumsum(n, axis=-1)], -1), total)


def segment_ids_from_padding_mask(mask: np.ndarray) -> np.ndarray:
    """Segment ids ``(B, T)`` from a padding mask ``(B, T)`` with 1 (or True) = real token:
    real tokens get id 0, padding -1, wherever it sits (left, right or between).

    Returns:
        int64 ``(B, T)``.
    """
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"padding mask must be (B, T), got {m.shape}")
    if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)):
        raise TypeError(f"padding mask must hold 0/1 or bools (1 = real token), got {m.dtype}")
    if np.any((m != 0) & (m != 1)):
        raise ValueError(f"padding mask must hold only 0 and 1 (1 = real token), got {m.tolist()}")
    return np.where(m.astype(bool), 0, -1).astype(np.int64)


def attention_mask(
    scores_shape: tuple[int, ...],
    *,
    mask: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool | str = False,
    window: Window | None = None,
    segment_ids: object = None,
) -> np.ndarray | None:
    """AND of every given constraint as a bool array broadcastable to ``scores_shape``.

    ``causal``: True or ``"bottom_right"``, or ``"top_left"``; the window is bottom-right
    aligned. ``segment_ids``: see :func:`segment_mask`.
    Returns None when nothing is masked, so callers can skip the work.
    """
    shape = tuple(scores_shape)
    Tq, Tk = shape[-2], shape[-1]
    keep: np.ndarray | None = None

    def _and(m: np.ndarray) -> None:
        nonlocal keep
        keep = m if keep is None else (keep & m)

    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(
                f"mask must be bool (True = may attend), got dtype {m.dtype}; pass additive "
                "float values as `bias`"
            )
        check_broadcast("mask", m.shape, shape)
        _and(m)
    if valid_lens is not None:
        _and(valid_lens_mask(valid_lens, shape))
    alignment = check_causal(causal)
    if alignment is not None:
        _and(causal_mask(Tq, Tk, alignment))
    win = check_window(window)
    if win is not None:
        _and(window_mask(Tq, Tk, win[0], win[1]))
    if segment_ids is not None:
        _and(segment_mask(segment_ids, shape))
    return keep


def masked_softmax(
    scores: np.ndarray,
    valid_lens: np.ndarray | None = None,
    *,
    mask: np.ndarray | None = None,
    axis: int = -1,
) -> np.ndarray:
    """Softmax over the allowed entries; masked entries are exactly 0, empty rows all 0.

    Args:
        scores: ``(B, ..., Tq, Tk)`` (any shape when only ``mask`` is given).
        valid_lens: d2l lengths, ``(B,)`` or ``(B, Tq)``; keys ``j < valid_len`` are valid.
            Only with ``axis=-1``.
        mask: bool, True = keep, broadcastable to ``scores``.
        axis: the normalised axis.

    Returns:
        Weights of ``scores``' shape and float dtype.
    """
    scores = np.asarray(scores)
    keep = None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be bool (True = keep), got dtype {m.dtype}")
        check_broadcast("mask", m.shape, scores.shape)
        keep = m
    if valid_lens is not None:
        if axis not in (-1, scores.ndim - 1):
            raise ValueError(f"valid_lens applies to the last axis, got axis={axis}")
        vm = valid_lens_mask(valid_lens, scores.shape)
        keep = vm if keep is None else keep & vm
    if keep is None:
        return softmax(scores, axis=axis)
    return softmax(np.where(keep, scores, -np.inf), axis=axis)


# -- backward -----------------------------------------------------------------------------


def masked_softmax_backward(
    weights: np.ndarray, d_weights: np.ndarray, axis: int = -1
) -> np.ndarray:
    """VJP of :func:`masked_softmax` with respect to ``scores``.

    Masking replaces excluded scores by the constant ``-inf``, so the result is the plain
    softmax backward ``dx = w * (dw - sum(dw * w))`` (see :func:`softmax_backward`): an
    excluded entry has ``w = 0`` and gets gradient 0, and an empty row gets all zeros.

    Args:
        weights: the forward's output.
        d_weights: its cotangent, same shape.
        axis: the normalised axis.

    Returns:
        The cotangent of ``scores``, shaped like ``weights``.
    """
    return softmax_backward(weights, d_weights, axis=axis)
