"""Launch plumbing shared by the flash and decode kernels' host code: what the kernels
accept of a tensor (dtype, device), int32 in-slice offsets, CUDA's grid-axis cap, padded
head dims, dot precision.
"""

from __future__ import annotations

import torch
import triton

from ..spec import check_fused_head_dims
from ._kernels import interpreting

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# CUDA caps grid axes y and z at 65535 programs; the kernels put B * H on axis 1, so a
# larger batch (many short sequences) is launched in batch slices of at most this many
# (batch, head) pairs. The interpreter has no such cap, which is why tests lower it.
_MAX_GRID_Y = 65535


def _int32_offsets(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a dense copy when offsets inside one (batch, head) slice overflow int32.

    The kernels add ``row * stride_t + col * stride_d`` in int32 (tile indices times
    runtime strides; only the batch/head offset is int64). A ``(B, T, H, D)`` view
    transposed to ``(B, H, T, D)`` has ``stride_t = H * D``: 128k tokens of a packed QKV
    projection with 64 heads of 128 (``stride_t = 3 * 8192``), or 256k tokens at a width of
    16384, wrap past 2^31 and would read the wrong rows on a GPU. A dense layout has
    ``stride_t = D`` and fits for any T below 8M.
    """
    return x.contiguous() if _int32_overflows(x) else x


def _int32_overflows(x: torch.Tensor) -> bool:
    """The largest offset within one (batch, head) slice of ``x`` reaches 2^31."""
    span = sum((n - 1) * abs(st) for n, st in zip(x.shape[-2:], x.stride()[-2:]) if n > 0)
    return span >= 2**31


def _batch_slices(B: int, H: int) -> list[slice] | None:
    """Batch slices whose ``b * H`` fits grid axis 1, or None when one launch fits."""
    if B * H <= _MAX_GRID_Y:
        return None
    if H > _MAX_GRID_Y:
        raise ValueError(f"H={H} heads exceed the {_MAX_GRID_Y} programs of a CUDA grid axis")
    step = _MAX_GRID_Y // H
    return [slice(b, min(b + step, B)) for b in range(0, B, step)]


def _padded(d: int) -> int:
    """A head dim as the kernels hold it: the next power of two, at least 16 (``tl.dot``)."""
    return max(16, triton.next_power_of_2(d))


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs are for testing: keep their dots in full precision, not tf32.
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_tensors(**tensors: torch.Tensor) -> None:
    """What the kernels need of their tensor arguments besides shapes (those are
    :func:`attnkit.spec.check_qkv`'s): torch tensors of one float dtype the kernels take,
    on one CUDA device (or the CPU under ``TRITON_INTERPRET=1``)."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    names, xs = ", ".join(tensors), list(tensors.values())
    if len({x.dtype for x in xs}) > 1:
        raise TypeError(f"{names} must share a dtype, got {', '.join(str(x.dtype) for x in xs)}")
    if len({x.device for x in xs}) > 1:
        raise ValueError(
            f"{names} must be on one device, got {', '.join(str(x.device) for x in xs)}"
        )
    device = xs[0].device
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"attnkit.triton kernels run on CUDA tensors (or on the CPU under "
            f"TRITON_INTERPRET=1); got tensors on {device}"
        )


def _check_head_dims(Dk: int, Dv: int) -> None:
    why = check_fused_head_dims(Dk, Dv)
    if why is not None:
        raise ValueError(why)
