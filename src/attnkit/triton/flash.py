"""Fused flash attention on Triton: argument checks, kernel launches, autograd.

The kernels themselves are in :mod:`attnkit.triton._forward` and
:mod:`attnkit.triton._backward`; the rules they share with every backend (shape fit, window,
scale, head-dim cap) are :mod:`attnkit.spec`'s. Layout is ``(B, H, T, D)``.
Masks follow DESIGN.md: causal and window are aligned to the bottom-right diagonal, so
query ``i`` sees key ``j`` iff ``j <= i + Tk - Tq`` under ``causal``::

    causal, Tq=2, Tk=4 (1 = keep)     causal, Tq=4, Tk=2 (rows 0, 1 see nothing)
        1 1 1 0                           0 0
        1 1 1 1                           0 0
                                          1 0
                                          1 1

A row that sees no key gives output 0 and LSE ``-inf`` (and zero gradients).

Score pipeline (the order matters when features are combined; it is FlashAttention's)::

    s = scale * q.k
    s = softcap * tanh(s / softcap)                 if softcap
    s = s - slope[b, h] * |i + Tk - Tq - j|         if alibi_slopes
    s = -inf where causal/window exclude (i, j)
    out = softmax(s) @ v,  lse = logsumexp(s)   (natural log, float32)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from torch.autograd.function import once_differentiable

from ..spec import LOG2E, check_fused_head_dims, check_qkv, default_scale, resolve_band
from ._backward import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess
from ._forward import _fwd_kernel
from ._kernels import interpreting

__all__ = ["flash_attention", "flash_attention_backward", "flash_attention_forward"]

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


@dataclass(frozen=True)
class _Spec:
    """Everything the kernels need besides the tensors, checked once."""

    B: int
    H: int
    Hkv: int
    Tq: int
    Tk: int
    Dk: int
    Dv: int
    scale: float
    left: int | None
    right: int | None
    softcap: float | None

    @property
    def group(self) -> int:
        return self.H // self.Hkv

    def scalars(self) -> dict[str, object]:
        """Keyword arguments shared by every kernel (scalars and constexprs)."""
        sc = self.softcap
        # A side wider than Tq + Tk (either sign) already keeps or drops every key, so it
        # is clamped there: the kernels add the sides to int32 indices, and a window such
        # as (None, 2**31 - 1) wrapped around and masked every key.
        reach = self.Tq + self.Tk
        left = 0 if self.left is None else max(-reach, min(reach, self.left))
        right = 0 if self.right is None else max(-reach, min(reach, self.right))
        return dict(
            Tq=self.Tq, Tk=self.Tk, diag_off=self.Tk - self.Tq, left=left, right=right,
            qk_scale2=self.scale * LOG2E,
            sc_in=0.0 if sc is None else self.scale / sc,
            sc_out2=0.0 if sc is None else sc * LOG2E,
            Q_BUCKET=triton.next_power_of_2(max(self.Tq, 1)),
            K_BUCKET=triton.next_power_of_2(max(self.Tk, 1)),
            Dk=self.Dk, Dv=self.Dv, BLOCK_DK=_padded(self.Dk), BLOCK_DV=_padded(self.Dv),
            HAS_LEFT=self.left is not None, HAS_RIGHT=self.right is not None,
            HAS_SOFTCAP=sc is not None,
        )


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


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
    window: tuple[int | None, int | None] | None, scale: float | None, softcap: float | None,
) -> _Spec:
    _check_tensors(q=q, k=k, v=v)
    check_qkv(q, k, v, batched=True)
    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    _check_head_dims(Dk, Dv)
    left, right = resolve_band(causal, window)
    if softcap is not None:
        softcap = float(softcap)
        if not softcap > 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
    return _Spec(B, H, Hkv, Tq, Tk, Dk, Dv, default_scale(scale, Dk), left, right, softcap)


def _slopes(alibi_slopes: torch.Tensor | None, spec: _Spec, device: torch.device) -> torch.Tensor:
    """ALiBi slopes as a float32 (B, H) contiguous tensor (a new one, never the caller's)."""
    if alibi_slopes is None:
        return torch.empty(1, dtype=torch.float32, device=device)
    if not isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = torch.as_tensor(alibi_slopes)
    if alibi_slopes.shape not in ((spec.H,), (spec.B, spec.H)):
        raise ValueError(
            f"alibi_slopes must be (H,) = ({spec.H},) or (B, H) = ({spec.B}, {spec.H}), "
            f"got {tuple(alibi_slopes.shape)}"
        )
    s = alibi_slopes.to(device=device, dtype=torch.float32)
    return s.expand(spec.B, spec.H).contiguous()


def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention forward, no autograd.

    Args:
        q: ``(B, H, Tq, Dk)``, float16/bfloat16/float32.
        k: ``(B, Hkv, Tk, Dk)``; ``H % Hkv == 0`` (GQA/MQA read K/V in place).
        v: ``(B, Hkv, Tk, Dv)``.
        causal: bottom-right aligned causal mask.
        window: ``(left, right)`` band around the diagonal; None (or a None side) =
            unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: scores -> ``softcap * tanh(scores / softcap)`` on the scaled scores.
        alibi_slopes: ``(H,)`` or ``(B, H)``; adds ``-slope * |i + Tk - Tq - j|``.

    Returns:
        ``(out (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq) float32, natural log)``.
    """
    spec = _check(q, k, v, causal, window, scale, softcap)
    q, k, v = (_int32_offsets(x) for x in (q, k, v))
    slopes = _slopes(alibi_slopes, spec, q.device)
    parts = _batch_slices(spec.B, spec.H)
    if parts is not None:
        outs = [flash_attention_forward(q[b], k[b], v[b], causal=causal, window=window,
                                        scale=scale, softcap=softcap,
                                        alibi_slopes=None if alibi_slopes is None else slopes[b])
                for b in parts]
        return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])
    B, H, Tq = spec.B, spec.H, spec.Tq
    out = torch.empty((B, H, Tq, spec.Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    if lse.numel() == 0:
        return out, lse

    def grid(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)

    _fwd_kernel[grid](
        q, k, v, out, lse, slopes,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H=H, G=spec.group, **spec.scalars(), HAS_ALIBI=alibi_slopes is not None,
        PRECISION=_precision(q.dtype),
    )
    return out, lse


def flash_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused attention backward, no autograd: recomputes P from the saved LSE.

    Three launches: ``delta = rowsum(dO * O) - dLSE``; dK, dV per key block (looping
    over the query heads of a GQA group, so the group's sum needs no atomics); dQ per
    query block. Deterministic.

    Args:
        dout: ``(B, H, Tq, Dv)``, gradient of ``out``.
        q, k, v, out, lse: as given to / returned by :func:`flash_attention_forward`.
        causal, window, scale, softcap, alibi_slopes: the forward's options.
        dlse: optional ``(B, H, Tq)`` gradient of ``lse`` (ring attention merges by LSE).

    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q``, ``k``, ``v``.
    """
    spec = _check(q, k, v, causal, window, scale, softcap)
    B, H, Hkv, Tq, Tk = spec.B, spec.H, spec.Hkv, spec.Tq, spec.Tk
    if tuple(dout.shape) != (B, H, Tq, spec.Dv) or tuple(out.shape) != tuple(dout.shape):
        raise ValueError(
            f"dout {tuple(dout.shape)} and out {tuple(out.shape)} must be (B, H, Tq, Dv) = "
            f"{(B, H, Tq, spec.Dv)}"
        )
    if tuple(lse.shape) != (B, H, Tq):
        raise ValueError(f"lse {tuple(lse.shape)} must be (B, H, Tq) = {(B, H, Tq)}")
    if dlse is not None and tuple(dlse.shape) != (B, H, Tq):
        raise ValueError(f"dlse {tuple(dlse.shape)} must be (B, H, Tq) = {(B, H, Tq)}")
    slopes = _slopes(alibi_slopes, spec, q.device)
    parts = _batch_slices(B, H)
    if parts is not None:
        grads = [flash_attention_backward(
            dout[b], q[b], k[b], v[b], out[b], lse[b], causal=causal, window=window,
            scale=scale, softcap=softcap,
            alibi_slopes=None if alibi_slopes is None else slopes[b],
            dlse=None if dlse is None else dlse[b]) for b in parts]
        return tuple(torch.cat(g) for g in zip(*grads))  # type: ignore[return-value]
    # Autograd often hands in broadcast gradients (stride 0, e.g. from out.sum()); a dense
    # copy lets the backward kernels use wide, aligned loads.
    dout = dout.to(q.dtype).contiguous()
    lse = lse.to(torch.float32).contiguous()
    q, k, v, out = (_int32_offsets(x) for x in (q, k, v, out))
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if q.numel() == 0 or k.numel() == 0 or v.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    dlse_arg = (delta if dlse is None
                else dlse.to(device=q.device, dtype=torch.float32).contiguous())
    pre_m = 64 if not interpreting() else 16
    _bwd_preprocess[(triton.cdiv(Tq, pre_m), B * H)](
        out, dout, dlse_arg, delta, *out.stride(), *dout.stride(), H, Tq,
        Dv=spec.Dv, BLOCK_DV=_padded(spec.Dv), HAS_DLSE=dlse is not None, BLOCK_M=pre_m,
    )
    common = dict(**spec.scalars(), HAS_ALIBI=alibi_slopes is not None,
                  PRECISION=_precision(q.dtype), scale=spec.scale)

    def grid_kv(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(Tk, meta["BLOCK_N"]), B * Hkv)

    _bwd_dkdv_kernel[grid_kv](
        q, k, v, dout, lse, delta, dk, dv, slopes,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
        H=H, Hkv=Hkv, G=spec.group, **common,
    )

    def grid_q(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)

    _bwd_dq_kernel[grid_q](
        q, k, v, dout, lse, delta, dq, slopes,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
        H=H, G=spec.group, **common,
    )
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """``(out, lse)`` with gradients for q, k, v (and through ``lse`` as well)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, window, scale, softcap, alibi_slopes):  # type: ignore[override]
        out, lse = flash_attention_forward(
            q, k, v, causal=causal, window=window, scale=scale, softcap=softcap,
            alibi_slopes=alibi_slopes,
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = dict(causal=causal, window=window, scale=scale, softcap=softcap,
                           alibi_slopes=alibi_slopes)
        return out, lse

    @staticmethod
    @once_differentiable  # the kernels have no double backward: say so, never return 0
    def backward(ctx, dout, dlse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, dlse=dlse,
                                              **ctx.options)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused attention with autograd: ``softmax(scale * q k^T [+ features]) v``.

    Args:
        q: ``(B, H, Tq, Dk)``, float16/bfloat16 (float32 for testing).
        k: ``(B, Hkv, Tk, Dk)``; GQA/MQA when ``Hkv < H`` (K/V never expanded).
        v: ``(B, Hkv, Tk, Dv)``.
        causal: bottom-right aligned: query ``i`` sees key ``j`` iff ``j <= i + Tk - Tq``.
        window: ``(left, right)``: key ``j`` allowed iff ``diag - left <= j <= diag +
            right`` with ``diag = i + Tk - Tq``; None (whole or per side) = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: Gemma-2 style ``softcap * tanh(s / softcap)`` on the scaled scores.
        alibi_slopes: ``(H,)`` or ``(B, H)`` float; adds ``-slope * |i + Tk - Tq - j|``
            to the (capped) scores (FlashAttention's convention; not differentiated).
        return_lse: also return the natural-log LSE ``(B, H, Tq)``, float32.

    Returns:
        ``out (B, H, Tq, Dv)``, or ``(out, lse)``. Rows with no allowed key: 0 and -inf.
    """
    out, lse = FlashAttentionFunction.apply(q, k, v, causal, window, scale, softcap,
                                            alibi_slopes)
    return (out, lse) if return_lse else out
