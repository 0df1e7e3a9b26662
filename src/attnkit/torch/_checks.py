"""Checks that only tensors need (type, floating dtype, device); shapes are
:mod:`attnkit.spec`'s, so arrays and tensors are held to one rule with one message.

The shape rule is a pure function of three shapes, so its answer is memoised: a decoding
loop calls :func:`attention` with the same shapes thousands of times, and re-deriving the
broadcast each time would cost more than a small attention call itself.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .. import spec

__all__ = [
    "check_bias", "check_call", "check_mask", "check_padding_mask", "check_qkv",
    "check_segment_ids", "check_sinks", "check_tensor", "qkv_shapes", "valid_lens_view",
]


def check_tensor(name: str, x: object) -> torch.Tensor:
    """``x`` when it is a floating-point tensor; ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


class _Shape(NamedTuple):
    """A bare shape with the ``.shape`` that :func:`attnkit.spec.check_qkv` reads."""

    shape: tuple[int, ...]


@functools.lru_cache(maxsize=1024)
def _qkv_rule(
    qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], batched: bool
) -> tuple[int, tuple[int, ...]]:
    q, k, v = _Shape(qs), _Shape(ks), _Shape(vs)
    G = spec.check_qkv(q, k, v, batched=batched)
    return G, spec.scores_shape(q, k, G)


def qkv_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batched: bool = False
) -> tuple[int, tuple[int, ...]]:
    """``(G, scores shape (..., H, Tq, Tk))`` of q, k, v that pass :func:`check_qkv`."""
    if torch.compiler.is_compiling():  # traced once per graph: no cache to consult
        return _qkv_rule.__wrapped__(tuple(q.shape), tuple(k.shape), tuple(v.shape), batched)
    # torch.Size is a tuple: it hashes and compares as one, so it serves as the cache key.
    return _qkv_rule(q.shape, k.shape, v.shape, batched)


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batched: bool = False
) -> int:
    """Validate q ``(..., H, Tq, Dk)``, k ``(..., Hkv, Tk, Dk)``, v ``(..., Hkv, Tk, Dv)``.

    The shape rules are :func:`attnkit.spec.check_qkv`'s (``batched``: exactly
    ``(B, H, T, D)`` with one ``B``); this adds what only tensors have: one floating dtype
    and one device. Returns the group size ``G = H // Hkv``.
    """
    _check_tensors(q, k, v)
    return qkv_shapes(q, k, v, batched=batched)[0]


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k, v are floating tensors of one dtype on one device."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")


def check_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[int, tuple[int, ...]]:
    """:func:`check_qkv` and the scores' shape in one step: ``(G, (..., H, Tq, Tk))``.

    Written for the hot path (a decoding step calls it for a few microseconds of work):
    the common case is one chain of cheap tests; any failure takes the path that names
    what is wrong."""
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.is_floating_point() and q.dtype == k.dtype == v.dtype
            and q.device == k.device == v.device):
        _check_tensors(q, k, v)
    return qkv_shapes(q, k, v)


def check_bias(
    bias: torch.Tensor | None, scores_shape: tuple[int, ...], device: torch.device | None = None
) -> None:
    """``bias`` (or None) is a float tensor broadcastable to the scores, on ``device`` if
    one is given."""
    if bias is None:
        return
    check_tensor("bias", bias)
    spec.check_broadcast("bias", tuple(bias.shape), scores_shape)
    if device is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device}, q on {device}")


def check_sinks(sinks: torch.Tensor | None, H: int, device: torch.device) -> None:
    """``sinks`` (or None) is a float tensor ``(H,)`` (:func:`attnkit.spec.check_sinks`) on
    ``device``."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor of shape (H,), got {type(sinks).__name__}")
    spec.check_sinks(sinks, H)
    if sinks.device != device:
        raise ValueError(f"sinks is on {sinks.device}, q on {device}")


def check_segment_ids(
    segment_ids: object, scores_shape: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``segment_ids`` (one ``(B, T)`` or a pair) as ``(q_ids (B, Tq), kv_ids (B, Tk))``
    integer tensors on ``device`` (:func:`attnkit.spec.check_segment_ids`), or None."""
    pair = spec.check_segment_ids(segment_ids, scores_shape)
    if pair is None:
        return None
    for name, ids in zip(("q_ids", "kv_ids"), pair):
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"segment_ids {name} must be a torch.Tensor, got {type(ids).__name__}")
        if ids.device != device:
            raise ValueError(f"segment_ids {name} is on {ids.device}, q on {device}")
    return pair


def check_mask(mask: object, scores_shape: tuple[int, ...]) -> None:
    """``mask`` is a bool tensor (True = may attend) broadcastable to ``scores_shape``; the
    messages name the shape the caller passed."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got "
            f"{getattr(mask, 'dtype', type(mask))}; pass additive float values as `bias`"
        )
    spec.check_broadcast("mask", tuple(mask.shape), tuple(scores_shape))


def valid_lens_view(lengths_shape: tuple[int, ...], scores_shape: tuple[int, ...]
                    ) -> tuple[int, ...]:
    """The shape ``valid_lens`` of ``lengths_shape`` take to broadcast against the scores
    as key counts (:func:`valid_lens_limits`); ``ValueError`` naming both shapes when they
    do not fit."""
    shape = tuple(scores_shape)
    if len(shape) < 3:
        raise ValueError(
            f"valid_lens needs scores with a batch axis (B, ..., Tq, Tk), got scores {shape}"
        )
    B, Tq = shape[0], shape[-2]
    vl = tuple(lengths_shape)
    if vl == (B,):
        return (B,) + (1,) * (len(shape) - 1)
    if vl == (B, Tq):
        return (B,) + (1,) * (len(shape) - 3) + (Tq, 1)
    raise ValueError(
        f"valid_lens of shape {vl} does not fit scores of shape {shape}: expected "
        f"(B,) = ({B},) or (B, Tq) = ({B}, {Tq})"
    )


def check_padding_mask(padding_mask: torch.Tensor, B: int, Tk: int | None) -> torch.Tensor:
    """``padding_mask`` as bool ``(B, Tk)`` (True = real token); ``Tk`` is the number
    of keys this call projects (None: a filled cross cache projects none)."""
    if not isinstance(padding_mask, torch.Tensor) or padding_mask.is_floating_point():
        raise TypeError(f"padding_mask must be a bool or 0/1 integer tensor (True = real "
                        f"token), got {getattr(padding_mask, 'dtype', padding_mask)!r}")
    if Tk is None or tuple(padding_mask.shape) != (B, Tk):
        what = ("no keys (a filled cross-attention cache)" if Tk is None
                else f"(B, Tk) = ({B}, {Tk})")
        raise ValueError(f"padding_mask covers the keys this call adds, {what}; got "
                         f"{tuple(padding_mask.shape)}")
    return padding_mask if padding_mask.dtype == torch.bool else padding_mask != 0
