"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention`` with attnkit's
semantics.

SDPA's ``is_causal`` is top-left aligned, so it is used only where that is the call's one
constraint (``causal="top_left"``, or bottom-right with ``Tq == Tk``); otherwise the mask
goes in as a bool mask (a float one when there is a bias). A row with no allowed key:
PyTorch's CPU kernel returns 0 for it (with zero gradients); elsewhere it is un-masked for
the kernel and zeroed afterwards. GQA goes through ``enable_gqa``; K and V are never
repeated here. NaN/inf in masked positions are kept out by
:mod:`attnkit.torch._nonfinite`.

Attention sinks ride along as one more key (:func:`_with_sink_key`): exact, so SDPA's
fused kernels and autograd serve them too. Only public ``torch.nn.functional`` is called;
``need_weights`` computes the weights beside the kernel
(:func:`attnkit.torch._scores.attention_weights`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ._bias import kernel_mask
from ._dtypes import stats_dtype
from ._keep import Keep
from ._nonfinite import guard_inputs, restore, restore_weights, zero_rows
from ._scores import attention_weights

__all__ = ["cpu_flash_causal", "plain_sdpa", "sdpa_path"]


def sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    G: int,
    shape: tuple[int, ...],
    keep: Keep | None,
    bias: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    sinks: torch.Tensor | None = None,
    codes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`attnkit.torch._math.math_path` (no softcap: SDPA applies no score
    function), with the output from SDPA."""
    is_causal = keep is not None and keep.sdpa_causal
    # Keys are cleaned unless SDPA masks their scores by a select: an attn_mask is added
    # to the scores (NaN + -inf is NaN), and so is is_causal's mask on SDPA's math kernel.
    by_select = is_causal and sinks is None and cpu_flash_causal(q, k, v, dropout_p)
    g = guard_inputs(q, k, v, keep, G, keys_by_select=by_select, codes=codes,
                     weights=need_weights)
    # PyTorch's CPU kernels give an empty row 0; with a sink no row is empty.
    unmask = q.device.type != "cpu" and sinks is None
    km = kernel_mask(None if is_causal else keep, bias, q.dtype, additive=False,
                     unmask_empty=unmask)
    mask = km.add if km.add is not None else km.allowed
    qs, ks, vs = g.q, g.k, g.v
    if sinks is not None:
        qs, ks, vs, mask = _with_sink_key(qs, ks, vs, sinks, scale, mask, is_causal)
    out = F.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **({"enable_gqa": True} if G > 1 else {}),
    )
    if sinks is not None:  # drop the sink's key (and the causal path's extra query)
        out = out[..., -shape[-2]:, :v.shape[-1]]
    if km.rows is not None:
        out = zero_rows(out, km.rows)
    if mask is None:  # no attn_mask (is_causal, or a sink alone): SDPA may drop a NaN row
        out = _keep_nan_rows(out, g.q, g.k, G, causal_keys=by_select)
    out = restore(out, g.out_fix, G)
    if torch.is_grad_enabled() and out.requires_grad:
        out = _FirstOrderOnly.apply(out)
    if not need_weights:
        return out, None
    wkm = kernel_mask(keep, bias, stats_dtype(q.dtype), additive=True)
    w = attention_weights(g.q, g.k, G, scale, wkm, shape, select=is_causal, sinks=sinks)
    return out, restore_weights(w, g.weight_fix, G, keep).to(q.dtype)


def cpu_flash_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     dropout_p: float) -> bool:
    """Whether ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` runs PyTorch's
    CPU flash kernel, which writes -inf over the scores of future keys (a select, so a
    NaN in such a key reaches no earlier query). Its conditions, from the shapes alone:
    CPU, 4-D, one head dim for q, k and v, unit last stride, a float dtype, no dropout,
    flash not switched off (``torch.backends.cuda.enable_flash_sdp``). Anything else
    may run the math kernel, which adds the mask. tests/torch/test_guard_band.py checks
    the kernel's behaviour on the installed PyTorch. While ``torch.compile`` traces, the
    compiled graph picks its own kernel: False (and the flag is not traceable)."""
    if torch.compiler.is_compiling():
        return False
    return (q.device.type == "cpu" and not dropout_p and q.ndim == 4 and k.ndim == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and 0 not in q.shape
            and 0 not in k.shape and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
            and q.dtype in _FLASH_DTYPES and torch.backends.cuda.flash_sdp_enabled())


_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def plain_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: int, scale: float, dropout_p: float
) -> torch.Tensor:
    """SDPA for a call with no mask, no bias, no variant and no weights (a decoding step,
    say): nothing to guard, so nothing but the kernel."""
    if G > 1:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale,
                                             enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    out = _keep_nan_rows(out, q, k, G, causal_keys=False)
    if out.requires_grad and torch.is_grad_enabled():
        out = _FirstOrderOnly.apply(out)
    return out


def _keep_nan_rows(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, G: int, *,
                   causal_keys: bool) -> torch.Tensor:
    """``out`` with NaN in the rows all of whose scores are NaN.

    Without an ``attn_mask``, SDPA's kernels (the CPU one in float32 and narrower, as
    measured) take the row max skipping NaN, so such a row looks fully masked and comes
    back 0: a query with a NaN entry, or, when keys go to the kernel as they are under
    top-left ``is_causal`` (``causal_keys``), a query whose keys ``j <= i`` all hold a NaN.
    The reference gives NaN. (All of a row's keys NaN without causal would need a pass
    over K per call; not done.) A row with some finite score propagates NaN by itself.
    """
    # clamp(0, 0) keeps NaN and sends everything else to 0 (a sum that overflows to inf
    # included): NaN where a query holds a NaN (or both infinities), else 0.
    # Detached: the fix carries NaN into the forward, no gradient (clamp's would be 1 at a
    # sum of exactly 0).
    fix = q.detach().sum(-1, keepdim=True).clamp_(0.0, 0.0)  # (..., H, Tq, 1)
    if causal_keys:
        bad = k.detach().sum(-1).isnan().to(torch.uint8)  # (..., Hkv, Tk)
        all_bad = bad.cummin(-1).values  # keys 0..j all hold a NaN
        last = torch.arange(q.shape[-2], device=q.device).clamp(max=k.shape[-2] - 1)
        all_bad = all_bad.index_select(-1, last)[..., None].bool()  # (..., Hkv, Tq, 1)
        k_fix = torch.where(all_bad, float("nan"), 0.0).to(fix.dtype)
        fix = fix + (k_fix.repeat_interleave(G, dim=-3) if G > 1 else k_fix)
    return out + fix if out.requires_grad else out.add_(fix)


class _FirstOrderOnly(torch.autograd.Function):
    """Identity on the output of SDPA, whose fused backward has no derivative of its own:
    a backward that builds a graph (``create_graph=True``) stops here with a message that
    says which path has one, instead of PyTorch's internal op name later on."""

    @staticmethod
    def forward(ctx: object, out: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            raise RuntimeError(
                "attnkit.torch.attention: the SDPA path has no double backward (its fused "
                "kernel's backward is not differentiable); for create_graph=True call "
                "attention(..., backend='math')"
            )
        return g


def _with_sink_key(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None,
    causal_top_left: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Attention sinks as one more key, so that SDPA's own kernels take them exactly.

    Every query gets one more feature, its head's sink logit ``z_h``; every key gets a 0
    there; a new first key is 0 everywhere except ``1/scale`` in that feature, with a
    value row of zeros. Its score is ``scale * z_h / scale = z_h`` for every query of head
    ``h`` and the real scores are unchanged, so the softmax over ``Tk + 1`` keys is the
    sink softmax and the output is the same (the sink's value is 0); autograd carries
    ``d z`` through the new feature. The per-head sink sits on the query side, so GQA's
    shared keys serve every head of a group. No row is ever empty (the sink is always
    allowed), and a row whose keys are all masked gets output 0.

    The mask (bool or float) gains an always-allowed first column. With SDPA's top-left
    ``is_causal`` a first query row is added too (it sees only the sink; the caller drops
    its output), so that query ``i`` (now ``i + 1``) keeps seeing keys ``j <= i`` (now
    ``j + 1``) and the sink. ``Dv`` is padded to ``Dk + 1`` when the two were equal, so
    that fused kernels wanting one head dim still apply; the caller slices it off.

    Returns:
        ``(q (..., H, Tq[+1], Dk+1), k (..., Hkv, Tk+1, Dk+1), v (..., Hkv, Tk+1, Dv[+1]),
        attn_mask (..., Tq, Tk+1) or None)``.
    """
    H = q.shape[-3] if q.ndim >= 3 else 1
    z = sinks.to(q.dtype).reshape((H, 1, 1) if q.ndim >= 3 else (1, 1))
    q = torch.cat([q, z.expand(q.shape[:-1] + (1,))], dim=-1)
    if causal_top_left:
        q = torch.cat([q.new_zeros(q.shape[:-2] + (1, q.shape[-1])), q], dim=-2)
    sink_key = k.new_zeros(k.shape[:-2] + (1, k.shape[-1] + 1))
    sink_key[..., -1] = 1.0 / scale
    k = torch.cat([sink_key, torch.nn.functional.pad(k, (0, 1))], dim=-2)
    v_pad = 1 if v.shape[-1] + 1 == k.shape[-1] else 0
    v = torch.nn.functional.pad(v, (0, v_pad, 1, 0))  # a zero value row for the sink
    if attn_mask is not None:
        col = attn_mask.shape[:-1] + (1,)
        first = attn_mask.new_ones(col) if attn_mask.dtype == torch.bool \
            else attn_mask.new_zeros(col)  # allowed, or bias 0
        attn_mask = torch.cat([first, attn_mask], dim=-1)
    return q, k, v, attn_mask
