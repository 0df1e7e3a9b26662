"""Functional attention for PyTorch: one entry point, three interchangeable paths.

Shape legend (used in every docstring and error message)::

    ...  leading batch dims        H    query heads     Hkv  key/value heads, H % Hkv == 0
    Tq   query length              Tk   key length      G    H // Hkv (group size)
    Dk   query/key head dim        Dv   value head dim

:func:`attention` computes ``softmax(q k^T * scale + bias, masked) v`` with the semantics of
:mod:`attnkit.numpy` (its float64 oracle): masks say True = may attend, ``causal`` and
``window`` are bottom-right aligned, ``valid_lens`` follows d2l, and a query with no allowed
key gets output 0 and zero gradients, never NaN. It runs on one of three paths:

- ``"triton"``: attnkit's fused GPU kernel (CUDA, fp16/bf16, no mask/bias/valid_lens, no
  dropout), imported lazily so that nothing here needs Triton.
- ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention``. Its ``is_causal`` is
  top-left aligned, so for ``Tq != Tk`` the bottom-right mask is built explicitly; rows with
  no allowed key are un-masked for the kernel and their output zeroed afterwards, so the
  fused kernel never sees an empty softmax (some backends return NaN there) and those rows
  get zero gradients. GQA goes through ``enable_gqa``; K and V are never repeated here.
- ``"math"``: plain matmul + float32 softmax with an explicit empty-row guard. It is the
  readable baseline and the only path that handles everything (double backward included).

``backend="auto"`` takes the first path that honours the call exactly, in that order.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..numpy.attention import check_additive
from ..spec import check_broadcast, check_window
from ..spec import check_qkv as _np_check_qkv
from .masks import Window, attention_mask

F = torch.nn.functional

__all__ = ["Backend", "additive_attention", "attention", "safe_softmax"]

Backend = Literal["auto", "sdpa", "math", "triton"]
_BACKENDS = ("auto", "sdpa", "math", "triton")
_HALF = (torch.float16, torch.bfloat16)


# -- checks ------------------------------------------------------------------------------


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate q ``(..., H, Tq, Dk)``, k ``(..., Hkv, Tk, Dk)``, v ``(..., Hkv, Tk, Dv)``.

    The shape rules are :func:`attnkit.numpy.attention.check_qkv`'s (one definition of
    what fits); this adds what only tensors have: a float dtype and a device, shared.
    Returns the group size ``G = H // Hkv`` (1 when heads match or there is no head axis).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    return _np_check_qkv(q, k, v)


def _check_common(
    dropout_p: float, backend: str, scale: float | None
) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")


# -- building blocks -----------------------------------------------------------------------


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics run in float32 for half precision, else in the input dtype."""
    return torch.float32 if dtype in _HALF else dtype


def safe_softmax(scores: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis; masked entries and rows with no allowed entry give 0.

    Computed in float32 for half-precision scores (float64 stays float64). Masked scores
    become ``-inf``; a row whose maximum is ``-inf`` (everything masked, by ``keep`` or by
    ``-inf`` in the scores) is replaced by zeros *before* the softmax so that neither the
    forward nor the backward pass ever forms ``-inf - (-inf)``: such rows get weight 0 and
    gradient 0. NaN in an allowed position propagates.

    Args:
        scores: ``(..., Tk)``.
        keep: bool, True = keep, broadcastable to ``scores``; None keeps everything.

    Returns:
        Weights in the statistics dtype (float32 or float64), ``scores``' shape.
    """
    s = scores.to(_stat_dtype(scores.dtype))
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")  # (..., 1)
    s = s.masked_fill(empty, 0.0)
    return torch.softmax(s, dim=-1).masked_fill(empty, 0.0)


def _group(x: torch.Tensor, G: int) -> torch.Tensor:
    """``(..., H, T, X)`` as ``(..., Hkv, G*T, X)``: the G query heads sharing one key/value
    head become one taller matrix, so a plain matmul serves GQA without repeating K/V."""
    if G == 1:
        return x
    *lead, H, T, X = x.shape
    return x.reshape(*lead, H // G, G * T, X)


def _ungroup(x: torch.Tensor, G: int, T: int) -> torch.Tensor:
    """Inverse of :func:`_group`: ``(..., Hkv, G*T, X)`` to ``(..., H, T, X)``."""
    if G == 1:
        return x
    *lead, Hkv, _, X = x.shape
    return x.reshape(*lead, Hkv * G, T, X)


def _scores(q: torch.Tensor, k: torch.Tensor, G: int, scale: float) -> torch.Tensor:
    """Scaled scores ``(..., H, Tq, Tk)`` in the statistics dtype, in a buffer of their own.

    float16 q and k are multiplied in float32: a float16 ``q . k`` overflows to inf past
    65504 (``Dk=64`` entries of 32 suffice) even when the scaled score is small. Only q and
    k are cast; the ``Tq x Tk`` result is wanted in float32 anyway. bfloat16 has float32's
    range, so it keeps its faster half-precision matmul.
    """
    mm = torch.float32 if q.dtype == torch.float16 else q.dtype
    s = _ungroup(_group(q.to(mm), G) @ k.to(mm).transpose(-1, -2), G, q.shape[-2])
    s = s.to(_stat_dtype(s.dtype))  # a no-op unless bfloat16 (then a new float32 buffer)
    return s.mul_(scale)  # in place: the matmul's backward does not read its output


def _scores_shape(q: torch.Tensor, k: torch.Tensor, G: int) -> tuple[int, ...]:
    n = 3 if G > 1 else 2
    lead = tuple(torch.broadcast_shapes(q.shape[:-n], k.shape[:-n]))
    head = (q.shape[-3],) if G > 1 else ()
    return lead + head + (q.shape[-2], k.shape[-2])


def _check_bias(bias: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if bias is None:
        return
    _check_tensor("bias", bias)
    check_broadcast("bias", tuple(bias.shape), shape)


class _SoftmaxFromLse(torch.autograd.Function):
    """``exp(s - lse)`` where ``lse = logsumexp(s)`` was computed elsewhere (by the fused
    kernel that produced the output), with the exact softmax gradient.

    The fused kernel already knows each row's log-sum-exp, so the weights cost one pass over
    the scores instead of three (max, sum, divide), done in place in ``s`` (a temporary the
    caller owns). The lse is treated as a constant in the forward but the backward is the
    full softmax Jacobian ``w * (g - sum(g * w))``, so gradients through the returned
    weights are exact.
    """

    @staticmethod
    def forward(ctx: object, s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        # Rows with lse = -inf have every score -inf: exp(-inf - 0) = 0, never NaN.
        lse = lse.masked_fill(lse == float("-inf"), 0.0)
        w = s.sub_(lse[..., None]).exp_()
        ctx.mark_dirty(w)  # type: ignore[attr-defined]
        ctx.save_for_backward(w)  # type: ignore[attr-defined]
        return w

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (w,) = ctx.saved_tensors  # type: ignore[attr-defined]
        gw = g * w
        return gw.sub_(w * gw.sum(dim=-1, keepdim=True)), None


def _weights_from_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    G: int,
    scale: float,
    attn_mask: torch.Tensor | None,
    causal_top_left: bool,
    lse: torch.Tensor | None,
) -> torch.Tensor:
    """Attention weights ``(..., H, Tq, Tk)`` (statistics dtype) next to a fused output.

    Costs one extra ``q k^T`` and one pass over the scores; the scores are built in a single
    buffer (scale, bias and mask applied in place, which autograd allows because nothing
    saved for backward reads them) that becomes the returned weights. When the kernel gave
    no ``lse``, it is computed here (one more pass).
    """
    s = _scores(q, k, G, scale)  # a fresh buffer: the in-place fills below touch no input
    if causal_top_left:
        s = s.masked_fill_(~_tril(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill_(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(s.dtype)  # not in place: attn_mask may need a gradient
    if lse is None:
        with torch.no_grad():
            lse = torch.logsumexp(s, dim=-1)
    return _SoftmaxFromLse.apply(s, lse.to(s.dtype))


# -- paths ---------------------------------------------------------------------------------


def _math_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    G: int,
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    s = _scores(q, k, G, scale)  # (..., H, Tq, Tk), float32 for half input
    if bias is not None:
        s = s + bias.to(s.dtype)
    w = safe_softmax(s, keep)
    dropped = F.dropout(w, dropout_p, training=True) if dropout_p > 0.0 else w
    out = _ungroup(_group(dropped.to(v.dtype), G) @ v, G, q.shape[-2])  # (..., H, Tq, Dv)
    return out, (w.to(q.dtype) if need_weights else None)


def _sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    G: int,
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    causal_top_left: bool,
    scale: float,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SDPA with attnkit semantics. ``causal_top_left`` is only set when ``Tq == Tk`` and
    causal is the sole constraint, where SDPA's top-left diagonal is ours."""
    attn_mask: torch.Tensor | None = None
    empty: torch.Tensor | None = None
    if bias is not None:
        b = _bias_as(bias, q.dtype)
        attn_mask = b if keep is None else b.masked_fill(~keep, float("-inf"))
        empty = (attn_mask == float("-inf")).all(dim=-1, keepdim=True)
        # Un-mask empty rows for the kernel (its softmax would be 0/0); zeroed below.
        attn_mask = attn_mask.masked_fill(empty, 0.0)
    elif keep is not None:
        empty = ~keep.any(dim=-1, keepdim=True)
        attn_mask = keep | empty
    gqa = {"enable_gqa": True} if G > 1 else {}

    weights = None
    if not need_weights:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal_top_left,
            scale=scale, **gqa,
        )
    else:
        lse = None
        if (
            q.device.type == "cpu" and q.ndim == 4 and q.shape[-1] == v.shape[-1]
            and dropout_p == 0.0 and not (bias is not None and bias.requires_grad)
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
        ):
            # The CPU flash kernel returns the row log-sum-exp next to the output. It is a
            # private op (what SDPA itself calls on CPU); without it, lse is computed below.
            fmask = attn_mask
            if fmask is not None and fmask.dtype == torch.bool:
                fmask = torch.zeros(fmask.shape, dtype=q.dtype, device=q.device).masked_fill(
                    ~fmask, float("-inf")
                )
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal_top_left, attn_mask=fmask, scale=scale
            )[:2]
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=causal_top_left, scale=scale, **gqa,
            )
        weights = _weights_from_lse(q, k, G, scale, attn_mask, causal_top_left, lse)
        if empty is not None:
            weights = weights.masked_fill(empty, 0.0)
        weights = weights.to(q.dtype)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out, weights


def _bias_as(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` in the kernel's dtype without overflow: finite values beyond float16's
    range saturate at its largest finite value instead of becoming +-inf (which would turn
    "very unlikely" into "excluded" and could empty a row). +-inf stays +-inf."""
    if dtype != torch.float16 or bias.dtype == torch.float16:
        return bias.to(dtype)
    big = torch.finfo(torch.float16).max
    return torch.where(torch.isinf(bias), bias, bias.clamp(-big, big)).to(dtype)


def _tril(Tq: int, Tk: int, device: torch.device) -> torch.Tensor:
    return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril()


def _triton_module() -> object | None:
    """``attnkit.triton`` when it is importable and usable here, else None."""
    try:
        import attnkit.triton as kernels  # optional and GPU-only: imported on first use
    except ImportError:
        return None
    return kernels if kernels.is_available() else None


_TRITON_MAX_HEAD_DIM = 256


def _triton_reason(
    q: torch.Tensor, has_mask: bool, has_bias: bool, dropout_p: float,
    k: torch.Tensor | None = None, v: torch.Tensor | None = None,
) -> str | None:
    """Why the Triton kernel cannot take this call, or None when it can."""
    if not q.is_cuda:
        return f"q is on {q.device}, the Triton kernel needs CUDA"
    if q.dtype not in _HALF:
        return f"the Triton kernel takes float16/bfloat16, got {q.dtype}"
    if q.ndim != 4:
        return f"the Triton kernel takes (B, H, T, D), got q {tuple(q.shape)}"
    if k is not None and v is not None:
        if k.shape[0] != q.shape[0]:
            return f"the Triton kernel does not broadcast batch: q {tuple(q.shape)}, k " \
                   f"{tuple(k.shape)}"
        if max(q.shape[-1], v.shape[-1]) > _TRITON_MAX_HEAD_DIM:
            return f"the Triton kernel takes head dims up to {_TRITON_MAX_HEAD_DIM}, got " \
                   f"Dk={q.shape[-1]}, Dv={v.shape[-1]}"
    if has_mask or has_bias:
        return "the Triton kernel takes no mask, bias or valid_lens (causal/window only)"
    if dropout_p > 0.0:
        return "the Triton kernel has no dropout"
    if _triton_module() is None:
        return "attnkit.triton is not importable or reports it is unavailable"
    return None


def triton_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int,
    scale: float | None = None,
) -> torch.Tensor | None:
    """Decoding attention straight from KV-cache buffers with attnkit's Triton kernel, or
    None when it cannot take the call (then use :func:`attention` on the filled views).

    Args:
        q: ``(B, H, Tq, Dk)``, the newest ``Tq`` positions (bottom-right causal).
        k_cache: ``(B, Hkv, capacity, Dk)``; positions ``[0, length)`` are filled.
        v_cache: ``(B, Hkv, capacity, Dv)``.
        length: filled positions, including this step's.
    """
    if _triton_reason(q, False, False, 0.0, k_cache, v_cache) is not None:
        return None
    kernels = _triton_module()
    return kernels.decode_attention(q, k_cache, v_cache, length, scale=scale)


def _triton_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    G: int,
    causal: bool,
    window: Window | None,
    scale: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    kernels = _triton_module()
    assert kernels is not None
    if not need_weights:
        out = kernels.flash_attention(q, k, v, causal=causal, window=window, scale=scale)
        return out, None
    out, lse = kernels.flash_attention(
        q, k, v, causal=causal, window=window, scale=scale, return_lse=True
    )
    keep = attention_mask(_scores_shape(q, k, G), causal=causal, window=window,
                          device=q.device)
    return out, _weights_from_lse(q, k, G, scale, keep, False, lse).to(q.dtype)


# -- public ----------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: Window | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention, ``softmax(q k^T * scale + bias, masked) v``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)`` without a head axis).
        k: ``(..., Hkv, Tk, Dk)``; ``Hkv`` divides ``H`` (GQA/MQA on axis -3).
        v: ``(..., Hkv, Tk, Dv)``; ``Dv`` may differ from ``Dk``.
        mask: bool, True = may attend, broadcastable to ``(..., H, Tq, Tk)``.
        bias: float, broadcastable, added to the scaled scores (``-inf`` excludes).
        valid_lens: ``(B,)`` or ``(B, Tq)`` integers: keys ``j < valid_len`` are valid.
        causal: bottom-right aligned causal mask (query ``i`` sees keys
            ``j <= i + Tk - Tq``).
        window: ``(left, right)`` band around that diagonal; None = unbounded.
        scale: defaults to ``1/sqrt(Dk)``.
        dropout_p: probability of zeroing a weight; applied only when ``training``.
        training: dropout is active only when True.
        need_weights: also return the pre-dropout weights ``(..., H, Tq, Tk)``. The output
            stays on the fused path; the weights are recomputed from one extra ``q k^T``
            and the kernel's log-sum-exp (``O(Tq*Tk)`` memory, which returning them
            needs anyway).
        backend: ``"auto"`` (see the module docstring), or ``"sdpa"``, ``"math"``,
            ``"triton"`` to force a path; a forced path that cannot honour the call
            raises ``ValueError`` saying why.

    Returns:
        ``(out (..., H, Tq, Dv), weights (..., H, Tq, Tk) or None)``. A query with no
        allowed key gets output 0 and weights 0, with zero gradients.

    Reference, without masks::

        w = softmax(q @ k.transpose(-1, -2) * scale)
        out = w @ v
    """
    G = check_qkv(q, k, v)
    _check_common(dropout_p, backend, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    shape = _scores_shape(q, k, G)
    _check_bias(bias, shape)
    if bias is not None and bias.device != q.device:
        raise ValueError(f"bias is on {bias.device}, q on {q.device}")
    win = check_window(window)
    p = float(dropout_p) if training else 0.0
    Tq, Tk = shape[-2], shape[-1]

    reason = _triton_reason(
        q, mask is not None or valid_lens is not None, bias is not None, p, k, v
    )
    if backend == "triton" and reason is not None:
        raise ValueError(f"backend='triton' cannot take this call: {reason}")
    if backend == "triton" or (backend == "auto" and reason is None and Tq and Tk):
        return _triton_path(q, k, v, G, causal, win, scale, need_weights)

    if causal and Tq == 1:
        causal = False  # one query at the bottom-right corner sees every key (decoding)
    # Only Tq == Tk causal with nothing else is SDPA's own (top-left == bottom-right) case.
    sdpa_causal = (
        causal and Tq == Tk and win is None and mask is None and valid_lens is None
        and bias is None
    )
    use_sdpa = backend == "sdpa" or backend == "auto"
    keep = attention_mask(
        shape, mask=mask, valid_lens=valid_lens,
        causal=causal and not (use_sdpa and sdpa_causal), window=win, device=q.device,
    )
    if Tq == 0 or Tk == 0:  # nothing to attend to: zero output, zero weights
        out = q.new_zeros(shape[:-1] + (v.shape[-1],))
        return out, (q.new_zeros(shape) if need_weights else None)

    full = keep  # every constraint, whichever path applies it
    if sdpa_causal and use_sdpa:
        full = attention_mask(shape, causal=True, device=q.device)
    finite = full is None or _all_finite(k, v)
    if not finite:
        # Garbage in key/value rows no query may attend (padding) is zeroed up front, so
        # that no 0 * nan reaches the output or, in the backward, any gradient.
        k, v = _zero_unattended_nonfinite(k, v, full, shape, G)
        finite = _all_finite(k, v)

    def run(
        k: torch.Tensor, v: torch.Tensor, need_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if use_sdpa:
            return _sdpa_path(
                q, k, v, G, keep, bias, sdpa_causal, scale, p, need_weights
            )
        return _math_path(q, k, v, G, keep, bias, scale, p, need_weights)

    out, weights = run(k, v, need_weights)
    if not finite:
        # A non-finite entry some queries attend and others may not: those that attend it
        # keep its NaN/inf; the others take the result computed with it zeroed.
        clean_out, clean_w = run(
            torch.nan_to_num(k, 0.0, 0.0, 0.0), torch.nan_to_num(v, 0.0, 0.0, 0.0),
            need_weights,
        )
        bad_k = (~torch.isfinite(k)).any(dim=-1, keepdim=True)  # (..., Hkv, Tk, 1)
        bad = bad_k | ~torch.isfinite(v)  # a non-finite key spoils its whole score
        out = torch.where(_attends(full, bad, G, out.shape), out, clean_out)
        if weights is not None and clean_w is not None:
            rows = _attends(full, bad_k, G, out.shape[:-1] + (1,))  # (..., H, Tq, 1)
            weights = torch.where(rows, weights, clean_w)
    return out, weights


def _all_finite(*xs: torch.Tensor) -> bool:
    """True when every entry of every tensor is finite. One reduction each and one host
    sync in all: a finite sum implies finite entries (inf or NaN anywhere makes the sum inf
    or NaN); a sum that overflows merely sends the caller down its slower, still exact,
    path."""
    total = sum(torch.sum(x, dtype=torch.float32 if x.dtype in _HALF else None) for x in xs)
    return bool(torch.isfinite(torch.as_tensor(total)))


def _zero_unattended_nonfinite(
    k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, shape: tuple[int, ...], G: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with NaN/inf zeroed in the key rows no query may attend (new
    tensors; the caller's are untouched). Only called when some entry is non-finite."""
    used = keep.expand(shape).any(dim=-2)  # (..., H, Tk)
    if G > 1:
        used = used.unflatten(-2, (used.shape[-2] // G, G)).any(dim=-2)  # (..., Hkv, Tk)
    while used.ndim > k.ndim - 1:  # leading dims q broadcast over k's
        used = used.any(dim=0)
    for i, n in enumerate(k.shape[:-2]):
        if n == 1 and used.shape[i] != 1:
            used = used.any(dim=i, keepdim=True)
    used = used[..., None]  # (..., Hkv, Tk, 1)
    return (
        torch.where(used | torch.isfinite(k), k, 0.0),
        torch.where(used | torch.isfinite(v), v, 0.0),
    )


def _attends(
    keep: torch.Tensor, bad: torch.Tensor, G: int, out_shape: tuple[int, ...]
) -> torch.Tensor:
    """Bool ``out_shape = (..., H, Tq, X)``: True where a query may attend a key whose
    entry ``bad (..., Hkv, Tk, X)`` is set (``X`` is ``Dv``, or 1 for whole key rows)."""
    allowed = keep.to(torch.float32)  # counts of 0/1 products: exact
    allowed = allowed.expand(tuple(out_shape[:-1]) + (bad.shape[-2],))  # (..., H, Tq, Tk)
    hits = _group(allowed, G) @ bad.to(allowed.dtype)  # (..., Hkv, G*Tq, X)
    return _ungroup(hits, G, out_shape[-2]) > 0


def _without_masked_nonfinite(
    out: torch.Tensor, clean: torch.Tensor, v: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Keep NaN/inf from *masked* value rows out of the output.

    A masked weight is exactly 0, but ``0 * nan = nan`` in the matmul. Rows of ``out`` that
    attend a non-finite value keep it (NaN in an attended position propagates); the others
    take ``clean``, the output recomputed with non-finite values zeroed. Only called when
    ``v`` has non-finite entries, so the common case pays one ``isfinite`` pass.
    """
    return torch.where(_attends(keep, ~torch.isfinite(v), 1, out.shape), out, clean)


# -- additive attention -----------------------------------------------------------------------


class _AdditiveScores(torch.autograd.Function):
    """``scores[..., i, j] = w_v . tanh(qh[..., i, :] + kh[..., j, :])``, key chunk by key chunk.

    Only one ``(..., Tq, chunk, h)`` slab of tanh features exists at a time, in the forward
    and in the backward (which recomputes the slab instead of storing it, and then turns it
    into the pre-activation gradient in place), so the extra memory is one slab plus
    ``(..., Tq, Tk)`` scores, not ``Tq * Tk * h`` features.
    """

    @staticmethod
    def forward(
        ctx: object, qh: torch.Tensor, kh: torch.Tensor, w_v: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        lead = torch.broadcast_shapes(qh.shape[:-2], kh.shape[:-2])
        Tq, Tk = qh.shape[-2], kh.shape[-2]
        scores = qh.new_empty(lead + (Tq, Tk))
        for j0 in range(0, Tk, chunk):
            feats = qh[..., :, None, :] + kh[..., None, j0:j0 + chunk, :]  # (..., Tq, c, h)
            scores[..., j0:j0 + chunk] = feats.tanh_() @ w_v  # (..., Tq, c)
        ctx.save_for_backward(qh, kh, w_v)  # type: ignore[attr-defined]
        ctx.chunk = chunk  # type: ignore[attr-defined]
        return scores

    @staticmethod
    def backward(
        ctx: object, g: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None]:
        qh, kh, w_v = ctx.saved_tensors  # type: ignore[attr-defined]
        chunk: int = ctx.chunk  # type: ignore[attr-defined]
        Tk, h = kh.shape[-2], kh.shape[-1]
        dqh = torch.zeros(g.shape[:-1] + (h,), dtype=g.dtype, device=g.device)
        dkh = torch.empty(g.shape[:-2] + (Tk, h), dtype=g.dtype, device=g.device)
        dw_v = torch.zeros_like(w_v)
        for j0 in range(0, Tk, chunk):
            j1 = min(j0 + chunk, Tk)
            feats = (qh[..., :, None, :] + kh[..., None, j0:j1, :]).tanh_()  # (..., Tq, c, h)
            gj = g[..., j0:j1]  # (..., Tq, c)
            dw_v += gj.reshape(1, -1).matmul(feats.reshape(-1, h)).reshape(h)
            # d tanh(x) = 1 - tanh(x)^2; the slab becomes the pre-activation gradient.
            dpre = feats.square_().neg_().add_(1.0).mul_(gj[..., None]).mul_(w_v)
            dqh += dpre.sum(dim=-2)
            dkh[..., j0:j1, :] = dpre.sum(dim=-3)
        return _unbroadcast(dqh, qh.shape), _unbroadcast(dkh, kh.shape), dw_v, None


def _unbroadcast(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``grad`` down to ``shape`` (undo broadcasting of leading dims)."""
    while grad.ndim > len(shape):
        grad = grad.sum(dim=0)
    dims = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    return grad.sum(dim=dims, keepdim=True) if dims else grad


def additive_scores(
    qh: torch.Tensor, kh: torch.Tensor, w_v: torch.Tensor, *, chunk_size: int | None = None,
    max_chunk_elements: int = 1 << 22,
) -> torch.Tensor:
    """Additive scores from projected queries ``qh (..., Tq, h)`` and keys ``kh (..., Tk, h)``.

    Args:
        qh: ``(..., Tq, h)``, i.e. ``q @ W_q``.
        kh: ``(..., Tk, h)``, i.e. ``k @ W_k``.
        w_v: ``(h,)``.
        chunk_size: keys per chunk; default: the most that keep one tanh slab
            ``(..., Tq, chunk, h)`` under ``max_chunk_elements``.
        max_chunk_elements: the slab budget (default 4 Mi elements = 16 MiB in float32).

    Returns:
        ``(..., Tq, Tk)`` scores. Extra memory beyond the inputs and result: one feature
        slab ``(..., Tq, chunk, h)`` (plus small per-chunk sums), in the forward and in the
        backward alike.
    """
    lead = torch.broadcast_shapes(qh.shape[:-2], kh.shape[:-2])
    Tq, Tk, h = qh.shape[-2], kh.shape[-2], qh.shape[-1]
    if chunk_size is None:
        per_key = max(1, math.prod(lead) * Tq * h)
        chunk_size = max(1, min(Tk, max_chunk_elements // per_key))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _AdditiveScores.apply(qh, kh, w_v, int(chunk_size))


def additive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: Window | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    chunk_size: int | None = None,
    max_chunk_elements: int = 1 << 22,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bahdanau attention: score ``a(q, k) = w_v . tanh(q W_q + k W_k)``, in key chunks.

    Weights use the ``x @ W`` layout of :func:`attnkit.numpy.additive_attention`
    (``nn.Linear.weight.T``).

    Args:
        q: ``(..., Tq, Dq)``.
        k: ``(..., Tk, Dk)``.
        v: ``(..., Tk, Dv)``.
        w_q: ``(Dq, h)``.
        w_k: ``(Dk, h)``.
        w_v: ``(h,)``.
        mask, bias, valid_lens, causal, window, dropout_p, training: as in
            :func:`attention`.
        chunk_size, max_chunk_elements: see :func:`additive_scores`.

    Returns:
        ``(out (..., Tq, Dv), weights (..., Tq, Tk))``, weights pre-dropout.
    """
    for name, x in zip(("q", "k", "v", "w_q", "w_k", "w_v"), (q, k, v, w_q, w_k, w_v)):
        _check_tensor(name, x)
    check_additive(q, k, v, w_q, w_k, w_v)
    lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    _check_common(dropout_p, "math", None)
    shape = lead + (q.shape[-2], k.shape[-2])
    _check_bias(bias, shape)
    keep = attention_mask(
        shape, mask=mask, valid_lens=valid_lens, causal=causal, window=window, device=q.device
    )
    if keep is not None and not _all_finite(k, v):
        # Garbage in padding rows: zeroed so that no 0 * nan reaches a gradient.
        k, v = _zero_unattended_nonfinite(k, v, keep, shape, 1)
    scores = additive_scores(
        q @ w_q, k @ w_k, w_v, chunk_size=chunk_size, max_chunk_elements=max_chunk_elements
    )
    if bias is not None:
        scores = scores.to(_stat_dtype(scores.dtype)) + bias.to(_stat_dtype(scores.dtype))
    w = safe_softmax(scores, keep)
    p = float(dropout_p) if training else 0.0
    dropped = F.dropout(w, p, training=True) if p > 0.0 else w
    out = dropped.to(v.dtype) @ v
    if keep is not None and not _all_finite(v):
        clean = dropped.to(v.dtype) @ torch.nan_to_num(v, 0.0, 0.0, 0.0)
        out = _without_masked_nonfinite(out, clean, v, keep)
    return out, w.to(q.dtype)
