"""Checks that only tensors need (type, floating dtype, device); shapes are
:mod:`attnkit.spec`'s, so arrays and tensors are held to one rule with one message."""

from __future__ import annotations

import torch

from .. import spec

__all__ = ["check_bias", "check_qkv", "check_segment_ids", "check_sinks", "check_tensor"]


def check_tensor(name: str, x: object) -> torch.Tensor:
    """``x`` when it is a floating-point tensor; ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, batched: bool = False
) -> int:
    """Validate q ``(..., H, Tq, Dk)``, k ``(..., Hkv, Tk, Dk)``, v ``(..., Hkv, Tk, Dv)``.

    The shape rules are :func:`attnkit.spec.check_qkv`'s (``batched``: exactly
    ``(B, H, T, D)`` with one ``B``); this adds what only tensors have: one floating dtype
    and one device. Returns the group size ``G = H // Hkv``.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    return spec.check_qkv(q, k, v, batched=batched)


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
