"""Masks, one meaning everywhere: **True = may attend**.

Every constraint an op accepts (``mask``, ``valid_lens``, ``causal``, ``window``) is turned
into a boolean array broadcastable to the scores ``(..., Tq, Tk)``, and the constraints are
ANDed. Masked scores become ``-inf``; rows with no allowed key are guarded by the softmax
and give exact zeros. No magic fill constants, no writes into the caller's arrays.

Causal and window masks are aligned to the bottom-right diagonal, so that a query block at
the end of a longer key sequence (a KV cache) sees what it should::

    causal, Tq=2, Tk=4 (1 = keep)      window=(1, 0), Tq=Tk=4
        1 1 1 0                            1 0 0 0
        1 1 1 1                            1 1 0 0
                                           0 1 1 0
                                           0 0 1 1
"""

from __future__ import annotations

import numbers

import numpy as np

from ..spec import Window, check_broadcast, check_length_range, check_window, check_window_side
from .softmax import softmax, softmax_backward

__all__ = [
    "attention_mask",
    "causal_mask",
    "masked_softmax",
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


def causal_mask(Tq: int, Tk: int) -> np.ndarray:
    """``(Tq, Tk)`` bool, bottom-right aligned: query ``i`` sees key ``j`` iff
    ``j <= i + Tk - Tq``."""
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


def attention_mask(
    scores_shape: tuple[int, ...],
    *,
    mask: np.ndarray | None = None,
    valid_lens: np.ndarray | None = None,
    causal: bool = False,
    window: Window | None = None,
) -> np.ndarray | None:
    """AND of every given constraint as a bool array broadcastable to ``scores_shape``.

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
    if causal:
        _and(causal_mask(Tq, Tk))
    win = check_window(window)
    if win is not None:
        _and(window_mask(Tq, Tk, win[0], win[1]))
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
