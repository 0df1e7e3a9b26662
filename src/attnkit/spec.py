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

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "LN2",
    "LOG2E",
    "MAX_FUSED_HEAD_DIM",
    "Window",
    "check_broadcast",
    "check_causal",
    "check_dropout",
    "check_fused_head_dims",
    "check_length_range",
    "check_qkv",
    "check_segment_ids",
    "check_sinks",
    "check_softcap",
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


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcasting of two shapes, in plain Python (``np.broadcast_shapes`` costs
    ~10 us a call, which a decode step that checks its inputs pays every token).

    Raises:
        ValueError: the shapes do not broadcast.
    """
    if a == b:
        return a
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


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
    if batched:
        if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
            raise ValueError(
                "expected q (B, H, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv); "
                f"got q {qs}, k {ks}, v {vs}"
            )
        if not qs[0] == ks[0] == vs[0]:
            raise ValueError(
                f"q, k, v must share the batch size B (no broadcasting): q {qs}, k {ks}, v {vs}"
            )
    if len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
        raise ValueError(f"q, k, v need at least 2 dims (T, D), got q {qs}, k {ks}, v {vs}")
    if not len(qs) == len(ks) == len(vs):
        raise ValueError(f"q, k, v must have the same number of dims, got q {qs}, k {ks}, v {vs}")
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
        broadcast_shapes(qs[:-n], ks[:-n])
    except ValueError:
        raise ValueError(f"batch dims of q {qs} and k {ks} do not broadcast") from None
    return G


def scores_shape(q: Any, k: Any, G: int) -> tuple[int, ...]:
    """The scores' shape ``(..., H, Tq, Tk)`` of q and k that passed :func:`check_qkv`."""
    qs, ks = shape_of(q), shape_of(k)
    n = 3 if G > 1 else 2
    lead = broadcast_shapes(qs[:-n], ks[:-n])
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
        b = broadcast_shapes(arr_shape, target)
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


def _is_bool(x: object) -> bool:
    """A Python or NumPy bool (``numpy.bool``, told by its type's name: this module imports
    no array library)."""
    return isinstance(x, bool) or type(x).__name__ in ("bool", "bool_")


# How a causal mask lines up when Tq != Tk. "bottom_right" (``causal=True``, attnkit's
# default): query i sees key j iff j <= i + Tk - Tq, the last query sees every key (a KV
# cache). "top_left" (PyTorch SDPA's and JAX's ``is_causal``): j <= i.
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")


def check_causal(causal: object) -> str | None:
    """``causal`` as its alignment, ``"bottom_right"`` or ``"top_left"``, or None when off.

    ``True`` means ``"bottom_right"``; ``False`` (or None) means no causal mask.
    """
    if causal is None or _is_bool(causal):
        return "bottom_right" if causal else None
    if isinstance(causal, str):
        if causal not in CAUSAL_ALIGNMENTS:
            raise ValueError(
                f"causal must be a bool, 'bottom_right' or 'top_left', got {causal!r}"
            )
        return causal
    raise TypeError(
        f"causal must be a bool, 'bottom_right' or 'top_left', got {type(causal).__name__}"
    )


def resolve_band(
    causal: object, window: object, Tq: int | None = None, Tk: int | None = None
) -> tuple[int | None, int | None]:
    """``causal`` and ``window`` as one band ``(left, right)`` around the bottom-right
    diagonal ``d = i + Tk - Tq`` (None = unbounded side), ANDed: key ``j`` is allowed for
    query ``i`` iff ``d - left <= j <= d + right``.

    Bottom-right causal is the band ``(None, 0)``. Top-left causal (``j <= i``) is the
    band ``(None, Tq - Tk)``, so it needs ``Tq`` and ``Tk``. The window is always aligned
    to the bottom-right diagonal, whichever way ``causal`` is aligned.
    """
    alignment = check_causal(causal)
    win = check_window(window)
    left, right = (None, None) if win is None else win
    if alignment is not None:
        if alignment == "top_left":
            if Tq is None or Tk is None:
                raise TypeError("resolve_band needs Tq and Tk for causal='top_left'")
            edge = int(Tq) - int(Tk)
        else:
            edge = 0
        right = edge if right is None else min(right, edge)
    return left, right


# -- variants: softcap, sinks, segment ids ----------------------------------------------

_INT_NAMES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")


def check_softcap(softcap: object) -> float | None:
    """``softcap`` as a positive finite float, or None (off). Scores become
    ``softcap * tanh(s / softcap)`` after the scale, before bias and masks."""
    if softcap is None:
        return None
    if _is_bool(softcap) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive float or None, got {softcap!r}")
    cap = float(softcap)
    if not (math.isfinite(cap) and cap > 0.0):
        raise ValueError(f"softcap must be a positive finite float or None, got {softcap}")
    return cap


def check_sinks(sinks: Any, H: int) -> None:
    """``sinks`` (array or tensor, or None) holds one float logit per query head: shape
    ``(H,)``. Each adds a value-less column to its head's softmax denominator."""
    if sinks is None:
        return
    if not hasattr(sinks, "shape"):
        raise TypeError(f"sinks must be an array or tensor of shape (H,), got {sinks!r:.60}")
    name = _dtype_name(sinks)
    if name not in _FLOAT_NAMES:
        raise TypeError(f"sinks must hold floats (one logit per query head), got dtype {name}")
    if shape_of(sinks) != (H,):
        raise ValueError(
            f"sinks must have shape (H,) = ({H},), one logit per query head, got "
            f"{shape_of(sinks)}"
        )


def check_segment_ids(segment_ids: Any, scores_shape: Any) -> tuple[Any, Any] | None:
    """Validate ``segment_ids`` against scores ``(B, ..., Tq, Tk)``; returns
    ``(q_ids (B, Tq), kv_ids (B, Tk))`` (the caller's objects, unconverted), or None.

    ``segment_ids`` is one integer ``(B, T)`` for self-attention (``Tq == Tk``; queries and
    keys share it) or a pair ``(q_ids (B, Tq), kv_ids (B, Tk))``. Query ``i`` may attend
    key ``j`` only if their ids are equal; an id < 0 is padding.
    """
    if segment_ids is None:
        return None
    shape = tuple(int(n) for n in scores_shape)
    if len(shape) < 3:
        raise ValueError(
            f"segment_ids need scores with a batch axis (B, ..., Tq, Tk), got scores {shape}"
        )
    B, Tq, Tk = shape[0], shape[-2], shape[-1]
    if isinstance(segment_ids, (tuple, list)):
        if len(segment_ids) != 2:
            raise ValueError(
                f"segment_ids must be one (B, T) array or a pair (q_ids, kv_ids), got "
                f"{len(segment_ids)} items"
            )
        q_ids, kv_ids = segment_ids
    else:
        if Tq != Tk:
            raise ValueError(
                f"one segment_ids array serves self-attention (Tq == Tk); scores {shape} have "
                f"Tq={Tq}, Tk={Tk}: pass a pair (q_ids (B, Tq), kv_ids (B, Tk))"
            )
        q_ids = kv_ids = segment_ids
    for name, ids, T, axis in (("q_ids", q_ids, Tq, "Tq"), ("kv_ids", kv_ids, Tk, "Tk")):
        if not hasattr(ids, "shape"):
            raise TypeError(f"segment_ids {name} must be an integer array or tensor, got "
                            f"{type(ids).__name__}")
        if _dtype_name(ids) not in _INT_NAMES:
            raise TypeError(f"segment_ids {name} must hold integers, got dtype {_dtype_name(ids)}")
        if shape_of(ids) != (B, T):
            what = "(B, T)" if q_ids is kv_ids else f"(B, {axis})"
            raise ValueError(
                f"segment_ids {name} must have shape {what} = ({B}, {T}) for scores {shape}, "
                f"got {shape_of(ids)}"
            )
    return q_ids, kv_ids


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
