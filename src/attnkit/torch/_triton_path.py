"""The Triton path: attnkit's fused GPU kernels, when they can honour a call exactly.

:mod:`attnkit.triton` is optional and GPU-only; :func:`triton_kernels` is the one place
that imports it, on first use, so nothing else in :mod:`attnkit.torch` (or
:mod:`attnkit.distributed`, which builds on :mod:`attnkit.torch.lse`) needs Triton.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ..spec import check_fused_head_dims, is_half
from ._keep import Keep
from ._nonfinite import guard_inputs, restore, restore_weights
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


# The variants (issue 12) the Triton kernels take; until a kernel takes one, calls that use
# it are declined here and run on another path.
TRITON_VARIANTS: frozenset[str] = frozenset({"softcap", "sinks", "segment_ids", "top_left"})


def triton_reason(
    q: torch.Tensor, has_mask: bool, has_bias: bool, dropout_p: float,
    k: torch.Tensor | None = None, v: torch.Tensor | None = None,
    variants: tuple[str, ...] = (),
) -> str | None:
    """Why the Triton kernel cannot take this call, or None when it can.

    ``variants``: the call's variants by name (``"softcap"``, ``"sinks"``,
    ``"segment_ids"``, ``"top_left"``), each declined unless in :data:`TRITON_VARIANTS`.
    """
    missing = [name for name in variants if name not in TRITON_VARIANTS]
    if missing:
        return f"the Triton kernel does not take {', '.join(missing)} yet"
    if not q.is_cuda:
        return f"q is on {q.device}, the Triton kernel needs CUDA"
    if not is_half(q.dtype):
        return f"the Triton kernel takes float16/bfloat16, got {q.dtype}"
    if q.ndim != 4:
        return f"the Triton kernel takes (B, H, T, D), got q {tuple(q.shape)}"
    if k is not None and v is not None:
        if k.shape[0] != q.shape[0]:
            return f"the Triton kernel does not broadcast batch: q {tuple(q.shape)}, k " \
                   f"{tuple(k.shape)}"
        too_wide = check_fused_head_dims(q.shape[-1], v.shape[-1])
        if too_wide is not None:
            return too_wide
    if has_mask or has_bias:
        return "the Triton kernel takes no mask, bias or valid_lens (causal/window only)"
    if dropout_p > 0.0:
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
    if triton_reason(q, False, False, 0.0, k_cache, v_cache) is not None:
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
    keep: Keep | None,
    causal: bool | str,
    window: Window | None,
    scale: float,
    need_weights: bool,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out, weights or None)`` from the fused kernel (weights rebuilt from its LSE),
    under the constraints ``keep`` (the band and the segments the kernel applies).

    The kernel masks scores by a select, so a NaN in a masked key cannot reach the
    forward; ``p @ v`` with ``p = 0`` still reads ``0 * nan`` from a masked value, and the
    backward's products read masked keys and empty queries, so the kernel gets inputs from
    :func:`attnkit.torch._nonfinite.guard_inputs` as SDPA does, and the output what its
    attended entries held added back. The variants are passed on only when set, so kernels
    that predate them still run every call :func:`triton_reason` lets through.
    """
    kernels = triton_kernels()
    assert kernels is not None
    given = {"softcap": softcap, "sinks": sinks, "segment_ids": segment_ids}
    variants = {name: value for name, value in given.items() if value is not None}
    opts = dict(causal=causal, window=window, scale=scale, **variants)
    g = guard_inputs(q, k, v, keep, G, keys_by_select=True, weights=need_weights)
    if not need_weights:
        return restore(kernels.flash_attention(g.q, g.k, g.v, **opts), g.out_fix, G), None
    out, lse = kernels.flash_attention(g.q, g.k, g.v, return_lse=True, **opts)
    allowed = None if keep is None else keep.full()
    # The kernel's LSE includes the sink, so exp(s - lse) are the sink-normalised weights.
    weights = weights_from_lse(g.q, g.k, G, scale, allowed, False, lse, softcap=softcap)
    weights = restore_weights(weights, g.weight_fix, G, keep)
    return restore(out, g.out_fix, G), weights.to(q.dtype)
