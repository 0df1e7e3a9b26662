"""The Triton path: attnkit's fused GPU kernels, when they can honour a call exactly.

:mod:`attnkit.triton` is optional and GPU-only; :func:`triton_kernels` is the one place
that imports it, on first use, so nothing else in :mod:`attnkit.torch` (or
:mod:`attnkit.distributed`, which builds on :mod:`attnkit.torch.lse`) needs Triton.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ..spec import check_fused_head_dims, is_half
from ._scores import weights_from_lse
from .masks import Window

__all__ = ["triton_decode", "triton_kernels", "triton_path", "triton_reason"]


def triton_kernels(*names: str) -> ModuleType | None:
    """``attnkit.triton`` when it is importable and usable here, else None.

    ``names``: kernels the caller needs. The package loads its kernels lazily; they are
    resolved now, so that a missing Triton shows up here (as None) rather than in the
    middle of a call.
    """
    try:
        # Not a cycle dodge: attnkit.triton is an optional, GPU-only package (never imports
        # attnkit.torch), imported on first use so that attnkit.torch works without it.
        import attnkit.triton as kernels

        if not kernels.is_available():
            return None
        for name in names:
            getattr(kernels, name)
    except (ImportError, AttributeError):
        return None
    return kernels


def triton_reason(
    device: str, dtype: torch.dtype, q_shape: tuple[int, ...], k_shape: tuple[int, ...],
    Dv: int, has_mask: bool, has_bias: bool, dropout: bool,
) -> str | None:
    """Why the Triton kernel cannot take a call of this structure, or None when it can
    (a pure function of the structure, but for the one import it may try on CUDA)."""
    if device != "cuda":
        return f"q is on {device}, the Triton kernel needs CUDA"
    if not is_half(dtype):
        return f"the Triton kernel takes float16/bfloat16, got {dtype}"
    if len(q_shape) != 4:
        return f"the Triton kernel takes (B, H, T, D), got q {tuple(q_shape)}"
    if k_shape[0] != q_shape[0]:
        return (f"the Triton kernel does not broadcast batch: q {tuple(q_shape)}, k "
                f"{tuple(k_shape)}")
    too_wide = check_fused_head_dims(q_shape[-1], Dv)
    if too_wide is not None:
        return too_wide
    if has_mask or has_bias:
        return "the Triton kernel takes no mask, bias or valid_lens (causal/window only)"
    if dropout:
        return "the Triton kernel has no dropout"
    if triton_kernels() is None:
        return "attnkit.triton is not importable or reports it is unavailable"
    return None


def triton_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int,
    scale: float | None = None,
) -> torch.Tensor | None:
    """Decoding attention straight from KV-cache buffers with attnkit's Triton kernel, or
    None when it cannot take the call (then use :func:`attnkit.torch.attention` on the
    filled views).

    Args:
        q: ``(B, H, Tq, Dk)``, the newest ``Tq`` positions (bottom-right causal).
        k_cache: ``(B, Hkv, capacity, Dk)``; positions ``[0, length)`` are filled.
        v_cache: ``(B, Hkv, capacity, Dv)``.
        length: filled positions, including this step's.
    """
    if triton_reason(q.device.type, q.dtype, tuple(q.shape), tuple(k_cache.shape),
                     v_cache.shape[-1], False, False, False) is not None:
        return None
    kernels = triton_kernels()
    assert kernels is not None
    return kernels.decode_attention(q, k_cache, v_cache, length, scale=scale)


def triton_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    causal: bool | str,
    window: Window | None,
    scale: float,
    need_weights: bool,
    allowed: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out, weights or None)`` from the fused kernel, which applies the band and the
    segments itself; with ``need_weights`` the weights are rebuilt from its LSE under
    ``allowed`` (the same constraints as a bool mask). The variants are passed on only
    when set, so kernels that predate them still run every call they can take."""
    kernels = triton_kernels()
    assert kernels is not None
    given = {"softcap": softcap, "sinks": sinks, "segment_ids": segment_ids}
    variants = {name: value for name, value in given.items() if value is not None}
    opts = dict(causal=causal, window=window, scale=scale, **variants)
    if not need_weights:
        return kernels.flash_attention(q, k, v, **opts), None
    out, lse = kernels.flash_attention(q, k, v, return_lse=True, **opts)
    # The kernel's LSE includes the sink, so exp(s - lse) are the sink-normalised weights.
    weights = weights_from_lse(q, k, G, scale, allowed, False, lse, softcap=softcap)
    return out, weights.to(q.dtype)
