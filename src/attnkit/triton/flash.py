"""Fused flash attention on Triton: argument checks and kernel launches (the public
functions and autograd are the custom ops of :mod:`attnkit.triton.ops` on these).

The kernels themselves are in :mod:`attnkit.triton._forward` and
:mod:`attnkit.triton._backward`; the rules they share with every backend (shape fit, window,
scale, head-dim cap) are :mod:`attnkit.spec`'s. Layout is ``(B, H, T, D)``.
Masks mean what they mean on every backend: causal (``True`` or ``"bottom_right"``) and
window are aligned to the bottom-right diagonal, so query ``i`` sees key ``j`` iff
``j <= i + Tk - Tq`` under ``causal``; ``causal="top_left"`` (SDPA's ``is_causal``) keeps
``j <= i``::

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
    s = -inf where causal/window exclude (i, j), or segment ids differ (or are < 0)
    out = softmax([s, sink]) @ [v, 0],  lse = logsumexp([s, sink])   (natural log, float32)

``sink`` (one logit per query head, optional) is a column with no value; see
:mod:`attnkit.triton._variants` for its gradient and for how segment ids skip blocks.

Precision (float32 inputs, logits up to 1e4 and beyond): the kernels take the row maximum
off in natural units and keep the LSE as a float32 pair ``hi + lo`` (the rounded LSE and its
rounding error), which the autograd path hands to the backward, so that the recomputed
probabilities are the forward's to float32 rounding at any magnitude. The public LSE is
``hi``; ``flash_attention_forward(..., lse_dtype=torch.float64)`` returns ``hi + lo`` in
float64, and :func:`flash_attention_backward` takes either (a float32 LSE limits the
recomputed probabilities to its own rounding, ``eps * |lse|``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from ..spec import (
    check_qkv,
    check_softcap,
    default_scale,
    resolve_band,
)
from ._backward import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess
from ._forward import _fwd_kernel
from ._kernels import interpreting
from ._launch import (
    _batch_slices,
    _check_head_dims,
    _check_tensors,
    _int32_offsets,
    _padded,
    _precision,
)
from ._variants import Segments, segment_ids_int32, segment_spans, sinks_float32

__all__ = ["flash_attention_backward", "flash_attention_forward"]


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
    seg: Segments | None = None  # int32 segment ids, or None

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
            qk_scale=self.scale,
            sc_in=0.0 if sc is None else self.scale / sc,
            sc_out=0.0 if sc is None else sc,
            Q_BUCKET=triton.next_power_of_2(max(self.Tq, 1)),
            K_BUCKET=triton.next_power_of_2(max(self.Tk, 1)),
            Dk=self.Dk, Dv=self.Dv, BLOCK_DK=_padded(self.Dk), BLOCK_DV=_padded(self.Dv),
            HAS_LEFT=self.left is not None, HAS_RIGHT=self.right is not None,
            HAS_SOFTCAP=sc is not None, HAS_SEG=self.seg is not None,
        )


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool | str,
    window: tuple[int | None, int | None] | None, scale: float | None, softcap: float | None,
    segment_ids: object = None,
) -> _Spec:
    _check_tensors(q=q, k=k, v=v)
    check_qkv(q, k, v, batched=True)
    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    _check_head_dims(Dk, Dv)
    left, right = resolve_band(causal, window, Tq, Tk)
    seg = segment_ids_int32(segment_ids, B, H, Tq, Tk, q.device)
    return _Spec(B, H, Hkv, Tq, Tk, Dk, Dv, default_scale(scale, Dk), left, right,
                 check_softcap(softcap), seg)


def _ids_and_spans(spec: _Spec, device: torch.device, keys_per_query: bool) -> list:
    """``[q_ids, kv_ids, lo, hi]`` for a kernel: the spans of keys each query may attend
    (``keys_per_query``) or of queries each key may be attended by; placeholders (never
    read) without segment ids."""
    if spec.seg is None:
        return [torch.empty(1, dtype=torch.int32, device=device)] * 4
    q_ids, kv_ids = spec.seg
    spans = segment_spans(q_ids, kv_ids) if keys_per_query else segment_spans(kv_ids, q_ids)
    return [q_ids, kv_ids, *spans]


def _sliced(spec: _Spec, b: slice) -> Segments | None:
    return None if spec.seg is None else spec.seg.batch(b)


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
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: object = None,
    lse_dtype: torch.dtype = torch.float32,
    _visits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention forward, no autograd.

    Args:
        q: ``(B, H, Tq, Dk)``, float16/bfloat16/float32.
        k: ``(B, Hkv, Tk, Dk)``; ``H % Hkv == 0`` (GQA/MQA read K/V in place).
        v: ``(B, Hkv, Tk, Dv)``.
        causal: True or ``"bottom_right"`` (``j <= i + Tk - Tq``), ``"top_left"``
            (``j <= i``), or False.
        window: ``(left, right)`` band around the bottom-right diagonal; None (or a None
            side) = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        softcap: scores -> ``softcap * tanh(scores / softcap)`` on the scaled scores.
        alibi_slopes: ``(H,)`` or ``(B, H)``; adds ``-slope * |i + Tk - Tq - j|``.
        sinks: ``(H,)`` float, one value-less logit per query head in each softmax
            denominator (and in the LSE).
        segment_ids: int ``(B, T)`` (self-attention) or a pair ``(q_ids (B, Tq), kv_ids
            (B, Tk))``: equal ids attend each other, an id < 0 attends nothing.
        lse_dtype: ``torch.float32`` (default) or ``torch.float64``: the LSE as the kernel
            keeps it, ``hi + lo``, exact enough for :func:`flash_attention_backward` and
            for merging partials at any magnitude of the logits.

    Returns:
        ``(out (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq) in lse_dtype, natural log)``.
    """
    if lse_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"lse_dtype must be torch.float32 or torch.float64, got {lse_dtype}")
    out, hi, lo = _forward(q, k, v, causal=causal, window=window, scale=scale, softcap=softcap,
                           alibi_slopes=alibi_slopes, sinks=sinks, segment_ids=segment_ids,
                           _visits=_visits)
    if lse_dtype == torch.float32:
        return out, hi
    return out, hi.double() + lo.double()  # -inf + 0 = -inf for rows with no key


def _forward(q, k, v, *, causal, window, scale, softcap, alibi_slopes, sinks, segment_ids,
             _visits=None):
    """The forward launch: ``(out, lse_hi, lse_lo)``, the LSE as a float32 pair."""
    spec = _check(q, k, v, causal, window, scale, softcap, segment_ids)
    q, k, v = (_int32_offsets(x) for x in (q, k, v))
    slopes = _slopes(alibi_slopes, spec, q.device)
    z = sinks_float32(sinks, spec.H, q.device)
    parts = _batch_slices(spec.B, spec.H)
    if parts is not None and _visits is None:
        outs = [_forward(q[b], k[b], v[b], causal=causal, window=window, scale=scale,
                         softcap=softcap,
                         alibi_slopes=None if alibi_slopes is None else slopes[b],
                         sinks=z, segment_ids=_sliced(spec, b))
                for b in parts]
        return tuple(torch.cat(x) for x in zip(*outs))
    B, H, Tq = spec.B, spec.H, spec.Tq
    out = torch.empty((B, H, Tq, spec.Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    lse_lo = torch.empty_like(lse)
    if lse.numel() == 0:
        return out, lse, lse_lo

    def grid(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)

    _fwd_kernel[grid](
        q, k, v, out, lse, lse_lo, slopes, slopes if z is None else z,
        *_ids_and_spans(spec, q.device, keys_per_query=True),
        slopes if _visits is None else _visits,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H=H, G=spec.group, **spec.scalars(), HAS_ALIBI=alibi_slopes is not None,
        HAS_SINKS=z is not None, COUNT_VISITS=_visits is not None,
        PRECISION=_precision(q.dtype),
    )
    return out, lse, lse_lo


def key_block_visits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: object
) -> tuple[int, int]:
    """``(visited, total)``: key blocks the forward kernel visits for these inputs and
    options (those of :func:`flash_attention_forward`), summed over its programs, and the
    blocks a dense pass would visit. For tests and benchmarks (it reads the counts back)."""
    B, H, Tq = q.shape[0], q.shape[1], q.shape[2]
    visits = torch.zeros(B * H * triton.cdiv(max(Tq, 1), 16) * 2, dtype=torch.int32,
                         device=q.device)  # room for the smallest BLOCK_M of any config
    flash_attention_forward(q, k, v, **options, _visits=visits)  # type: ignore[arg-type]
    pairs = visits.view(-1, 2).sum(0).tolist()
    return int(pairs[0]), int(pairs[1])


def flash_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    segment_ids: object = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused attention backward, no autograd: recomputes P from the saved LSE.

    Three launches: ``delta = rowsum(dO * O) - dLSE``; dK, dV per key block (looping
    over the query heads of a GQA group, so the group's sum needs no atomics); dQ per
    query block. Deterministic.

    Args:
        dout: ``(B, H, Tq, Dv)``, gradient of ``out``.
        q, k, v, out, lse: as given to / returned by :func:`flash_attention_forward`;
            ``lse`` float32 or float64 (``lse_dtype=torch.float64``: exact at any magnitude).
        causal, window, scale, softcap, alibi_slopes, segment_ids: the forward's options.
            Sinks need no argument here: ``lse`` includes them, which is all dQ, dK, dV
            need (the sinks' own gradient is :func:`attnkit.triton._variants.sinks_grad`).
        dlse: optional ``(B, H, Tq)`` gradient of ``lse`` (ring attention merges by LSE).

    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q``, ``k``, ``v``.
    """
    spec = _check(q, k, v, causal, window, scale, softcap, segment_ids)
    _check_grad_shapes(spec, dout, out, lse, dlse)
    hi = lse.to(torch.float32)
    lo = torch.zeros_like(hi)
    if lse.dtype == torch.float64:  # the float32 pair the kernel keeps: lse = hi + lo
        fin = torch.isfinite(lse)
        lo = torch.where(fin, lse - torch.where(fin, hi, 0.0).double(), 0.0).float()
    return _backward(dout, q, k, v, out, hi, lo, spec=spec, alibi_slopes=alibi_slopes,
                     dlse=dlse)


def _check_grad_shapes(
    spec: _Spec, dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    dlse: torch.Tensor | None,
) -> None:
    """The backward's extra tensors fit the forward's shapes."""
    B, H, Tq = spec.B, spec.H, spec.Tq
    if tuple(dout.shape) != (B, H, Tq, spec.Dv) or tuple(out.shape) != tuple(dout.shape):
        raise ValueError(
            f"dout {tuple(dout.shape)} and out {tuple(out.shape)} must be (B, H, Tq, Dv) = "
            f"{(B, H, Tq, spec.Dv)}"
        )
    if tuple(lse.shape) != (B, H, Tq):
        raise ValueError(f"lse {tuple(lse.shape)} must be (B, H, Tq) = {(B, H, Tq)}")
    if dlse is not None and tuple(dlse.shape) != (B, H, Tq):
        raise ValueError(f"dlse {tuple(dlse.shape)} must be (B, H, Tq) = {(B, H, Tq)}")


def _backward(dout, q, k, v, out, lse, lse_lo, *, spec, alibi_slopes, dlse):
    """The backward launches, from the LSE as the float32 pair ``lse + lse_lo``."""
    B, H, Hkv, Tq, Tk = spec.B, spec.H, spec.Hkv, spec.Tq, spec.Tk
    slopes = _slopes(alibi_slopes, spec, q.device)
    parts = _batch_slices(B, H)
    if parts is not None:
        grads = [_backward(
            dout[b], q[b], k[b], v[b], out[b], lse[b], lse_lo[b],
            spec=replace(spec, B=q[b].shape[0], seg=_sliced(spec, b)),
            alibi_slopes=None if alibi_slopes is None else slopes[b],
            dlse=None if dlse is None else dlse[b]) for b in parts]
        return tuple(torch.cat(g) for g in zip(*grads))  # type: ignore[return-value]
    # Autograd often hands in broadcast gradients (stride 0, e.g. from out.sum()); a dense
    # copy lets the backward kernels use wide, aligned loads.
    dout = dout.to(q.dtype).contiguous()
    lse = lse.to(torch.float32).contiguous()
    lse_lo = lse_lo.to(device=q.device, dtype=torch.float32).contiguous()
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
        q, k, v, dout, lse, lse_lo, delta, dk, dv, slopes,
        *_ids_and_spans(spec, q.device, keys_per_query=False),
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
        H=H, Hkv=Hkv, G=spec.group, **common,
    )

    def grid_q(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)

    _bwd_dq_kernel[grid_q](
        q, k, v, dout, lse, lse_lo, delta, dq, slopes,
        *_ids_and_spans(spec, q.device, keys_per_query=True),
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
        H=H, G=spec.group, **common,
    )
    return dq, dk, dv
