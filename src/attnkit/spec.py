"""The rules every backend shares, written once: what fits, what is valid, what dtype.

This module imports neither torch nor triton (NumPy only), so :mod:`attnkit.numpy`,
:mod:`attnkit.torch`, :mod:`attnkit.triton` and :mod:`attnkit.distributed` all call it and
none keeps a copy. The checks read only ``.ndim``, ``.shape`` and plain Python values, so
they take NumPy arrays and torch tensors alike, and their messages read the same for both
(shapes are printed as plain tuples, ``(2, 3)``, never ``torch.Size([2, 3])``).

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

Errors: a bad shape or value raises ``ValueError``, a bad type ``TypeError``, and the
message names the argument and the offending shapes or values.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = [
    "LN2",
    "LOG2E",
    "MAX_FUSED_HEAD_DIM",
    "Window",
    "check_broadcast",
    "check_dropout",
    "check_fused_head_dims",
    "check_length_range",
    "check_qkv",
    "check_window",
    "check_window_side",
    "default_scale",
    "merge_by_lse",
    "resolve_band",
    "shape_of",
    "stats_dtype_name",
]

Window = tuple["int | None", "int | None"]

# The fused kernels (Triton flash and decode) hold a head's row in registers: 256 is the
# widest head dim they are compiled and tested for.
MAX_FUSED_HEAD_DIM = 256

# Blockwise softmaxes (NumPy flash, the Triton kernels) run in base 2, exp(x) ==
# exp2(x * LOG2E), and convert their log-sum-exp back to natural log (x LN2) at the boundary.
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def shape_of(x: Any) -> tuple[int, ...]:
    """``x.shape`` as a plain tuple, so messages read ``(2, 3)`` for arrays and tensors."""
    return tuple(int(n) for n in x.shape)


# -- q, k, v -----------------------------------------------------------------------------


def check_qkv(q: Any, k: Any, v: Any, *, batched: bool = False) -> int:
    """Validate q ``(..., H, Tq, Dk)``, k ``(..., Hkv, Tk, Dk)``, v ``(..., Hkv, Tk, Dv)``.

    Args:
        q, k, v: arrays or tensors (only ``.ndim`` and ``.shape`` are read).
        batched: the kernels' layout: exactly ``(B, H, T, D)``, the same ``B`` for all
            three (no batch broadcasting).

    Returns:
        The group size ``G = H // Hkv`` (1 when heads match or there is no head axis).
    """
    qs, ks, vs = shape_of(q), shape_of(k), shape_of(v)
    shapes = f"q {qs}, k {ks}, v {vs}"
    if batched:
        if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
            raise ValueError(
                f"expected q (B, H, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv); got {shapes}"
            )
        if not qs[0] == ks[0] == vs[0]:
            raise ValueError(f"q, k, v must share the batch size B (no broadcasting): {shapes}")
    if len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
        raise ValueError(f"q, k, v need at least 2 dims (T, D), got {shapes}")
    if not len(qs) == len(ks) == len(vs):
        raise ValueError(f"q, k, v must have the same number of dims, got {shapes}")
    if qs[-1] != ks[-1]:
        raise ValueError(f"q and k must share Dk: q {qs} has Dk={qs[-1]}, k {ks} has Dk={ks[-1]}")
    if ks[:-1] != vs[:-1]:
        raise ValueError(
            f"k and v must agree on every axis but the last (Tk and batch/heads): k {ks}, v {vs}"
        )
    G = 1
    if len(qs) >= 3 and qs[-3] != ks[-3]:
        H, Hkv = qs[-3], ks[-3]
        if Hkv == 0 or H % Hkv:
            raise ValueError(
                f"query heads H={H} must be a multiple of key/value heads Hkv={Hkv}: "
                f"q {qs}, k {ks}"
            )
        G = H // Hkv
    n = 3 if G > 1 else 2  # with GQA the head axes were checked above
    try:
        np.broadcast_shapes(qs[:-n], ks[:-n])
    except ValueError:
        raise ValueError(f"batch dims of q {qs} and k {ks} do not broadcast") from None
    return G


def scores_shape(q: Any, k: Any, G: int) -> tuple[int, ...]:
    """The scores' shape ``(..., H, Tq, Tk)`` of q and k that passed :func:`check_qkv`."""
    qs, ks = shape_of(q), shape_of(k)
    n = 3 if G > 1 else 2
    lead = tuple(np.broadcast_shapes(qs[:-n], ks[:-n]))
    head = (qs[-3],) if G > 1 else ()
    return lead + head + (qs[-2], ks[-2])


def check_fused_head_dims(Dk: int, Dv: int, limit: int = MAX_FUSED_HEAD_DIM) -> str | None:
    """Why a fused kernel cannot take these head dims, or None when it can."""
    if not (1 <= Dk <= limit and 1 <= Dv <= limit):
        return f"the fused kernels take head dims 1..{limit}, got Dk={Dk}, Dv={Dv}"
    return None


# -- masks -------------------------------------------------------------------------------


def check_broadcast(name: str, arr_shape: Any, target: Any) -> None:
    """``name`` (a mask or bias of ``arr_shape``) must broadcast to the scores ``target``
    without changing their shape."""
    arr_shape, target = tuple(arr_shape), tuple(target)  # "(2, 3)", never "torch.Size"
    try:
        b = np.broadcast_shapes(arr_shape, target)
    except ValueError:
        b = None
    if b != target:
        raise ValueError(f"{name} of shape {arr_shape} is not broadcastable to scores {target}")


def check_length_range(lo: int, hi: int, maxlen: int, *, of: str = "the key length Tk") -> None:
    """Lengths (``valid_lens``) whose smallest is ``lo`` and largest ``hi`` lie in
    ``[0, maxlen]``; ``of`` says what ``maxlen`` is, for the message."""
    if lo < 0 or hi > maxlen:
        raise ValueError(f"valid_lens must lie in [0, {maxlen}] ({of}), got min {lo} and max {hi}")


def check_window_side(name: str, side: object) -> None:
    """One side of a window is an int (a width) or None (unbounded); a bool is neither."""
    if side is not None and (not isinstance(side, numbers.Integral) or isinstance(side, bool)):
        raise TypeError(f"window {name} must be an int or None, got {side!r}")


def check_window(window: object) -> tuple[int | None, int | None] | None:
    """Validate ``window = (left, right)``; None when it constrains nothing.

    Sides come back as Python ints (a NumPy integer is accepted and converted), or None.
    """
    if window is None:
        return None
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise TypeError(f"window must be a (left, right) pair, got {window!r}")
    left, right = window
    check_window_side("left", left)
    check_window_side("right", right)
    if left is None and right is None:
        return None
    return (None if left is None else int(left), None if right is None else int(right))


def resolve_band(causal: bool, window: object) -> tuple[int | None, int | None]:
    """``causal`` and ``window`` as one band ``(left, right)`` around the bottom-right
    diagonal (None = unbounded side): causal is the band ``(None, 0)``, ANDed with the
    window."""
    win = check_window(window)
    left, right = (None, None) if win is None else win
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


# -- scalars -----------------------------------------------------------------------------


def default_scale(scale: object, Dk: int) -> float:
    """``scale`` as a finite float; None gives ``1 / sqrt(Dk)``."""
    if scale is None:
        return 1.0 / math.sqrt(Dk) if Dk > 0 else 1.0  # Dk = 0: every score is 0 anyway
    s = float(scale)  # type: ignore[arg-type]
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite, got {scale}")
    return s


def check_dropout(dropout_p: object) -> float:
    """``dropout_p`` as a float in ``[0, 1)``."""
    p = float(dropout_p)  # type: ignore[arg-type]
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return p


# -- dtypes ------------------------------------------------------------------------------

_HALF_NAMES = ("float16", "bfloat16")


def stats_dtype_name(dtype: object) -> str:
    """The dtype softmax statistics (max, sum, LSE) run in, by name: float32 for half
    precision and float32, float64 for float64. Takes a NumPy or torch dtype (or its
    name)."""
    name = str(dtype).removeprefix("torch.")
    if name in _HALF_NAMES or name == "float32":
        return "float32"
    if name == "float64":
        return "float64"
    raise TypeError(f"expected a floating dtype (float16, bfloat16, float32, float64), got {name}")


def is_half(dtype: object) -> bool:
    """float16 or bfloat16 (NumPy or torch dtype, or its name)."""
    return str(dtype).removeprefix("torch.") in _HALF_NAMES


# -- merging partial results -------------------------------------------------------------


def merge_by_lse(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, xp: Any) -> tuple[Any, Any]:
    """Attention over two disjoint key sets merged into attention over their union.

    The one rule :func:`attnkit.numpy.merge_partials` and
    :func:`attnkit.distributed.merge_partials` (and so ring attention) share; ``xp`` is the
    array namespace (``numpy`` or ``torch``; only ``maximum``, ``minimum``, ``where``,
    ``exp``, ``log1p`` and ``isneginf`` are used). Shapes are the caller's to check.

    Each side's weight is taken relative to the larger LSE ``m``: ``w = exp(lse - m)``, so
    the larger side's weight is exactly 1 and the other's lies in ``[0, 1]``, and the output
    is normalised by the sum of the weights::

        out = (w_a * out_a + w_b * out_b) / (w_a + w_b),   lse = m + log1p(min(w_a, w_b))

    Nothing here rounds at the magnitude of the LSE: the weights depend on ``lse_a - lse_b``
    alone, and merging two identical partials returns them unchanged (``(x + x) / 2 == x``)
    at any finite LSE, in any dtype. (``exp(lse_a - logaddexp(lse_a, lse_b))`` instead
    inherits the rounding of the merged LSE: at 1e8 in float32 it doubled the output.)

    A side with ``lse = -inf`` (no allowed key) has weight 0 and its output, NaN included,
    never reaches the result; both sides ``-inf`` give output 0 and ``lse = -inf``. NaN in
    an LSE propagates.

    Args:
        out_a, out_b: ``(..., Tq, Dv)``.
        lse_a, lse_b: ``(..., Tq)``, natural log.
        xp: ``numpy`` or ``torch``.

    Returns:
        ``(out, lse)``; ``out`` in the promotion of the weights' and outputs' dtypes (the
        caller casts), ``lse`` in the LSEs' dtype.
    """
    m = xp.maximum(lse_a, lse_b)
    empty = xp.isneginf(m)
    m_safe = xp.where(empty, 0.0, m)
    w_a = xp.exp(lse_a - m_safe)  # exp(-inf) = 0 for an empty side; exactly 1 for the larger
    w_b = xp.exp(lse_b - m_safe)
    lse = xp.where(empty, -math.inf, m + xp.log1p(xp.minimum(w_a, w_b)))
    total = xp.where(empty, 1.0, w_a + w_b)[..., None]  # in [1, 2] unless both are empty
    w_a, w_b = w_a[..., None], w_b[..., None]
    # where(), not a bare product: an empty side's output (even NaN) never leaks in.
    num = xp.where(w_a != 0, w_a * out_a, 0.0) + xp.where(w_b != 0, w_b * out_b, 0.0)
    return num / total, lse
