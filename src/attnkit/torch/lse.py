"""Attention with its log-sum-exp: the forward returns each row's LSE next to the output,
and the backward takes a *final* output and LSE.

This is what merging partial results needs: :mod:`attnkit.distributed` (ring attention)
runs it on one block (this rank's queries x one visiting K/V block), merges the partials
by LSE, and feeds the final output and LSE back, so that each block's probabilities
``exp(s - lse)`` are already normalised over the whole sequence.

On CUDA, when ``attnkit.triton`` is importable, no key mask is given and the head dims fit
the fused kernels, ``flash_attention_forward/backward`` do the work. Otherwise a plain
torch path computes the same thing: scores in float32 (float64 for float64 input), query
rows in tiles so that memory stays ``O(tile * Tk)`` (under a causal mask each tile stops at
the last key its rows can see, so a causal block costs about half a full one), GQA by
viewing queries as ``(B, Hkv, G, Tq, D)`` so K/V are never copied ``G`` times.

Fully masked rows (no allowed key in this block) give output 0 and LSE ``-inf``; their
gradients are 0. Masked scores are selected away (``-inf``); NaN in an attended position
propagates, and what a masked position holds is the caller's (as on every fused path).
Nothing here reads a tensor back.

Precision: the LSE can be asked for in float64 (``lse_dtype``), the float32 row max and sum
added without rounding at the LSE's magnitude; ring attention merges and differentiates
with it, so float32 results stay exact at logits ~1e4 (a float32 LSE there is only good to
5e-4, and so would be every probability recomputed from it). The backward recomputes
``P = exp((s - hi) - lo)`` from the LSE split into float32 ``hi + lo``.

Variants (in the order every backend applies them: scale, softcap, masks): ``softcap``
caps the scaled scores, ``segment_ids`` mask pairs whose ids differ (id < 0: padding),
``causal`` may be aligned ``"top_left"``. ``sinks`` (a value-less logit per query head)
join the forward's softmax denominators and LSE; the backward needs no sinks argument,
since the final LSE it is given already holds them, and :func:`sinks_backward` gives the
sinks' own gradient. Ring attention adds the sinks once, when it merges its partials, not
in every block.
"""

from __future__ import annotations

import math
from types import ModuleType

import torch

from ..spec import (
    check_causal,
    check_fused_head_dims,
    check_qkv,
    check_segment_ids,
    check_sinks,
    check_softcap,
    default_scale,
)
from ._dtypes import stats_dtype
from ._triton_path import triton_kernels

__all__ = ["attention_with_lse", "attention_with_lse_backward", "sinks_backward"]

Segments = tuple[torch.Tensor, torch.Tensor]  # (q_ids (B, Tq), kv_ids (B, Tk))

# Query rows per tile in the torch path. The scores of a tile are (B, H, rows, Tk); their
# element count is kept near a budget: on the CPU the tile and its temporaries then stay
# in cache (measured: a 2048 x 2048 block, 8 heads, fwd+bwd, took about 2x longer with
# 512-row tiles than with 64-row ones); on a GPU the budget only bounds memory.
_TILE_ELEMS = {"cpu": 2**20, "cuda": 2**26}
_ROW_TILE: int | None = None  # a fixed tile height overrides the budget (tests use it)


def _row_tile(q: torch.Tensor, Tk: int) -> int:
    if _ROW_TILE is not None:
        return _ROW_TILE
    per_row = max(1, q.shape[0] * q.shape[1] * Tk)  # score elements of one query row
    budget = _TILE_ELEMS.get(q.device.type, _TILE_ELEMS["cpu"])
    return max(16, min(4096, budget // per_row))


# The fused kernels take float32 as well as half precision (ring blocks in float32 too).
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _use_triton(
    q: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
) -> ModuleType | None:
    """The fused kernels when they can take this block (from the shapes, dtype and device
    alone), else None (torch does the work)."""
    if key_mask is not None or not q.is_cuda or q.dtype not in _TRITON_DTYPES:
        return None
    if check_fused_head_dims(q.shape[-1], v.shape[-1]) is not None:
        return None
    return triton_kernels("flash_attention_forward", "flash_attention_backward")


def _lse_dtype(lse_dtype: torch.dtype | None, dt: torch.dtype) -> torch.dtype:
    if lse_dtype is None:
        return dt
    if lse_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"lse_dtype must be torch.float32 or torch.float64, got {lse_dtype}")
    return torch.promote_types(lse_dtype, dt)


def _split_lse(lse: torch.Tensor, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``lse`` as ``hi + lo`` in ``dt`` (``lo`` = 0 unless ``lse`` is wider); ``-inf``
    rows get ``hi = +inf``, ``lo = 0``, so ``exp((s - hi) - lo)`` is 0 with no inf - inf."""
    hi = lse.to(dt)
    lo = torch.zeros_like(hi)
    if lse.dtype.itemsize > hi.dtype.itemsize:
        fin = torch.isfinite(lse)
        lo = torch.where(fin, lse - torch.where(fin, hi, 0.0).to(lse.dtype), 0.0).to(dt)
    return torch.where(torch.isneginf(hi), torch.full_like(hi, math.inf), hi), lo


def _neg_inf_guard(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-inf`` replaced by 0, to rebase exponentials of rows with no allowed key."""
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


def _tile_scores(
    qt: torch.Tensor,
    k: torch.Tensor,
    row0: int,
    offset: int | None,
    *,
    scale: float,
    key_mask: torch.Tensor | None,
    softcap: float | None = None,
    seg: Segments | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Scaled, capped, masked scores of query rows ``[row0, row0 + Tt)``, the softcap's
    ``tanh`` (None without softcap) for the backward, and the allowed pairs (None when
    every one is).

    ``qt`` is ``(B, Hkv, G, Tt, Dk)``, ``k`` is ``(B, Hkv, 1, Tk, Dk)``; returns
    ``(B, Hkv, G, Tt, Tk)`` with ``-inf`` at disallowed keys. ``offset``: causal, query
    ``i`` sees key ``j`` iff ``j <= i + offset`` (None: no causal mask). ``seg``: the ids
    of these rows and of these keys.
    """
    s = torch.matmul(qt, k.transpose(-1, -2)) * scale
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(s / softcap)
        s = tanh * softcap
    allowed = None
    if offset is not None:
        i = torch.arange(row0, row0 + qt.shape[-2], device=s.device)[:, None] + offset
        j = torch.arange(k.shape[-2], device=s.device)[None, :]
        allowed = j <= i
    if key_mask is not None:
        km = key_mask[:, None, None, None, :]  # (B, 1, 1, 1, Tk)
        allowed = km if allowed is None else allowed & km
    if seg is not None:
        qi, kj = seg[0][:, :, None], seg[1][:, None, :]
        same = ((qi == kj) & (qi >= 0))[:, None, None]  # (B, 1, 1, Tt, Tk)
        allowed = same if allowed is None else allowed & same
    if allowed is not None:
        s = torch.where(allowed, s, torch.full_like(s, -math.inf))
    return s, tanh, allowed


def _causal_offset(causal: bool | str, Tq: int, Tk: int) -> int | None:
    """Query ``i`` sees keys ``j <= i + offset``: ``Tk - Tq`` bottom-right, 0 top-left;
    None without causal."""
    alignment = check_causal(causal)
    if alignment is None:
        return None
    return 0 if alignment == "top_left" else Tk - Tq


def _keys_seen(r1: int, Tk: int, offset: int | None) -> int:
    """How many leading keys the query rows before ``r1`` can see (all of them without causal).

    Under a causal mask row ``r1 - 1`` sees keys ``j <= r1 - 1 + offset``; the keys after
    that are skipped, not masked, which halves the work of a causal block.
    """
    return Tk if offset is None else max(0, min(Tk, r1 + offset))


def _segments(segment_ids: object, q: torch.Tensor, k: torch.Tensor) -> Segments | None:
    """``segment_ids`` (``(B, T)`` or a pair) as ``(q_ids (B, Tq), kv_ids (B, Tk))`` on q's
    device, checked by :func:`attnkit.spec.check_segment_ids`."""
    pair = check_segment_ids(segment_ids, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    if pair is None:
        return None
    q_ids, kv_ids = (torch.as_tensor(x, device=q.device) for x in pair)
    return q_ids, kv_ids


def _rows(seg: Segments | None, r0: int, r1: int, j: int) -> Segments | None:
    return None if seg is None else (seg[0][:, r0:r1], seg[1][:, :j])


def _with_sinks(
    o: torch.Tensor, l: torch.Tensor, m: torch.Tensor, z: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised output ``o``, row sum ``l`` and max ``m`` of a tile (base ``e``), with
    the sink logit ``z`` joined as one more value-less column."""
    m2 = torch.maximum(m, z)
    m2_safe = _neg_inf_guard(m2)
    alpha = torch.where(torch.isneginf(m), 0.0, torch.exp(m - m2_safe))
    l2 = l * alpha + torch.where(torch.isneginf(z), 0.0, torch.exp(z - m2_safe))
    return o * alpha, l2, m2


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool | str,
    scale: float,
    key_mask: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: object = None,
    lse_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q k^T * scale, masked) v`` and its natural-log LSE.

    Args:
        q: ``(B, H, Tq, Dk)``.
        k: ``(B, Hkv, Tk, Dk)``.
        v: ``(B, Hkv, Tk, Dv)``.
        causal: True or ``"bottom_right"`` (query ``i`` sees key ``j <= i + Tk - Tq``),
            ``"top_left"`` (``j <= i``), or False.
        scale: multiplies the scores.
        key_mask: optional bool ``(B, Tk)``, True = may attend.
        softcap: ``softcap * tanh(s / softcap)`` on the scaled scores (None = off).
        sinks: optional ``(H,)`` logits, one value-less column per softmax denominator.
        segment_ids: int ``(B, T)`` (``Tq == Tk``) or a pair ``(q_ids (B, Tq), kv_ids
            (B, Tk))``: equal ids attend each other, an id < 0 attends nothing.
        lse_dtype: None = the compute dtype; ``torch.float64`` keeps the LSE exact
            enough for merging and for the backward at any magnitude of the logits.

    Returns:
        ``(out (B, H, Tq, Dv) in the compute dtype, lse (B, H, Tq))``: compute dtype is
        float64 for float64 input, else float32; ``lse`` is natural-log (in ``lse_dtype``),
        ``-inf`` where a row has no allowed key (its output is 0), the sink's logit when
        there are sinks.
    """
    G = check_qkv(q, k, v, batched=True)
    scale = default_scale(scale, q.shape[-1])  # a finite float (spec's one rule)
    offset = _causal_offset(causal, q.shape[2], k.shape[2])
    softcap = check_softcap(softcap)
    check_sinks(sinks, q.shape[1])
    seg = _segments(segment_ids, q, k)
    dt = stats_dtype(q.dtype, k.dtype, v.dtype)
    lse_dt = _lse_dtype(lse_dtype, dt)
    ops = _use_triton(q, v, key_mask)
    if ops is not None:
        # Ring blocks are slices along T: hand the kernel dense tensors.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = ops.flash_attention_forward(q, k, v, causal=causal, scale=scale,
                                               softcap=softcap, sinks=sinks, segment_ids=seg,
                                               lse_dtype=lse_dt)
        return out.to(dt), lse

    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    qg = q.to(dt).reshape(B, Hkv, G, Tq, Dk)
    kg = k.to(dt).unsqueeze(2)  # (B, Hkv, 1, Tk, Dk): broadcasts over the G query heads
    if Tq == 0:
        return q.new_zeros((B, H, 0, Dv), dtype=dt), q.new_zeros((B, H, 0), dtype=lse_dt)
    vg = v.to(dt).unsqueeze(2)  # (B, Hkv, 1, Tk, Dv)
    z = None if sinks is None else sinks.to(device=q.device, dtype=dt).reshape(Hkv, G, 1, 1)
    outs, lses = [], []
    tile = _row_tile(q, Tk)
    for r0 in range(0, Tq, tile):
        r1 = min(r0 + tile, Tq)
        j = _keys_seen(r1, Tk, offset)
        s, _, _ = _tile_scores(
            qg[..., r0:r1, :], kg[..., :j, :], r0, offset, scale=scale,
            key_mask=None if key_mask is None else key_mask[:, :j], softcap=softcap,
            seg=_rows(seg, r0, r1, j),
        )
        if j:
            m = s.amax(dim=-1, keepdim=True)
        else:  # no key visible to this tile at all
            m = s.new_full(s.shape[:-1] + (1,), -math.inf)
        p = torch.exp(s - _neg_inf_guard(m))  # exp(-inf) = 0 at masked keys
        l = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p, vg[..., :j, :])
        if z is not None:
            o, l, m = _with_sinks(o, l, m, z)
        # l == 0 exactly when the row has no allowed key: output 0, lse -inf.
        empty = l == 0
        o = o / torch.where(empty, 1.0, l)
        outs.append(torch.where(empty, torch.zeros_like(o), o))
        # The row max and sum added in the LSE's dtype: in float64, no rounding at |m|.
        m_w, l_w = m.to(lse_dt), torch.where(empty, 1.0, l).to(lse_dt)
        lse = torch.where(empty, -math.inf, m_w + torch.log(l_w))
        lses.append(lse.squeeze(-1))
    out = torch.cat(outs, dim=-2).reshape(B, H, Tq, Dv)
    lse = torch.cat(lses, dim=-1).reshape(B, H, Tq)
    return out, lse


def attention_with_lse_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool | str,
    scale: float,
    key_mask: torch.Tensor | None = None,
    softcap: float | None = None,
    segment_ids: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`attention_with_lse` given the *final* output and LSE of its
    query rows (which may cover more keys than ``k``: then these are one block's shares).

    With ``P = exp(s - lse)`` (normalised over all keys, not only this block's) and
    ``delta = rowsum(dout * out)``: ``dV = P^T dout``, ``dS = P * (dout V^T - delta)``,
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q`` (``dS`` times ``1 - tanh^2`` under
    softcap). Summing these over the blocks of a row gives the exact gradient of the full
    attention (one block: the exact gradient). Sinks need no argument: ``lse`` holds them.

    ``P`` is recomputed as ``exp((s - hi) - lo)`` from the LSE split into ``hi + lo`` in
    the compute dtype: pass the LSE in float64 (``attention_with_lse(...,
    lse_dtype=torch.float64)``) and float32 gradients are exact at any magnitude of the
    logits; from a float32 LSE, ``P`` carries its rounding (``eps * |lse|``). With ``P``
    that exact, ``delta = rowsum(dout * out)`` in float32 is precise enough (measured at
    logits 1e4: within the rule where the LSE was the culprit).

    Args:
        dout: ``(B, H, Tq, Dv)``.
        q, k, v: as in :func:`attention_with_lse`.
        out: ``(B, H, Tq, Dv)`` final output of these rows.
        lse: ``(B, H, Tq)`` final LSE of these rows (``-inf``: row fully masked, grads 0),
            best in float64 (see above).
        causal, scale, key_mask, softcap, segment_ids: as in :func:`attention_with_lse`.

    Returns:
        ``(dq (B, H, Tq, Dk), dk (B, Hkv, Tk, Dk), dv (B, Hkv, Tk, Dv))`` in the compute
        dtype (float64 for float64 input, else float32).
    """
    G = check_qkv(q, k, v, batched=True)
    scale = default_scale(scale, q.shape[-1])
    offset = _causal_offset(causal, q.shape[2], k.shape[2])
    softcap = check_softcap(softcap)
    seg = _segments(segment_ids, q, k)
    ops = _use_triton(q, v, key_mask)
    if ops is not None:
        dt = stats_dtype(q.dtype)
        dq, dk, dv = ops.flash_attention_backward(
            dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
            out.to(q.dtype).contiguous(), lse.contiguous(), causal=causal, scale=scale,
            softcap=softcap, segment_ids=seg,
        )
        return dq.to(dt), dk.to(dt), dv.to(dt)

    dt = stats_dtype(q.dtype, k.dtype, v.dtype)
    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    qg = q.to(dt).reshape(B, Hkv, G, Tq, Dk)
    kg, vg = k.to(dt).unsqueeze(2), v.to(dt).unsqueeze(2)  # (B, Hkv, 1, Tk, D)
    dog = dout.to(dt).reshape(B, Hkv, G, Tq, Dv)
    og = out.to(dt).reshape(B, Hkv, G, Tq, Dv)
    hi, lo = (x.reshape(B, Hkv, G, Tq, 1) for x in _split_lse(lse, dt))
    dq_tiles = [q.new_zeros((B, Hkv, G, 0, Dk), dtype=dt)]
    dk = torch.zeros(B, Hkv, Tk, Dk, dtype=dt, device=q.device)
    dv = torch.zeros(B, Hkv, Tk, Dv, dtype=dt, device=q.device)
    tile = _row_tile(q, Tk)
    for r0 in range(0, Tq, tile):
        r1 = min(r0 + tile, Tq)
        qt, dot = qg[..., r0:r1, :], dog[..., r0:r1, :]
        j = _keys_seen(r1, Tk, offset)
        s, tanh, allowed = _tile_scores(
            qt, kg[..., :j, :], r0, offset, scale=scale,
            key_mask=None if key_mask is None else key_mask[:, :j], softcap=softcap,
            seg=_rows(seg, r0, r1, j),
        )
        # hi = +inf on a fully masked row: its probabilities are 0, not exp(s + inf).
        p = torch.exp((s - hi[..., r0:r1, :]) - lo[..., r0:r1, :])
        if allowed is not None:
            p = torch.where(allowed, p, torch.zeros_like(p))
        delta = (dot * og[..., r0:r1, :]).sum(dim=-1, keepdim=True)  # (B, Hkv, G, Tt, 1)
        dv[..., :j, :] += torch.matmul(p.transpose(-1, -2), dot).sum(dim=2)
        ds = p * (torch.matmul(dot, vg[..., :j, :].transpose(-1, -2)) - delta)
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        dq_tiles.append(torch.matmul(ds, kg[..., :j, :]) * scale)
        dk_t = torch.matmul(ds.transpose(-1, -2), qg[..., r0:r1, :])
        dk[..., :j, :] += dk_t.sum(dim=2) * scale
    dq = torch.cat(dq_tiles, dim=-2).reshape(B, H, Tq, Dk)
    return dq, dk, dv


def sinks_backward(
    dout: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor,
    dlse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient of the sinks ``(H,)`` given the final ``out``/``lse`` of some query rows:
    ``d_sink[h] = -sum_{b,i} exp(sink[h] - lse[b,h,i]) * (rowsum(dO * O) - dLSE)[b,h,i]``.

    Over a subset of rows (a ring rank's shard) it is those rows' share; the shares sum
    to the gradient. ``dout``/``out`` ``(B, H, Tq, Dv)``, ``lse``/``dlse`` ``(B, H, Tq)``.
    Returned in the sinks' dtype and device.
    """
    dt = stats_dtype(out.dtype, lse.dtype)
    z = sinks.to(device=out.device, dtype=dt)[None, :, None]
    delta = (dout.to(dt) * out.to(dt)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(dt)
    live = ~torch.isneginf(z) & ~torch.isneginf(lse)  # a -inf sink takes no mass
    p_sink = torch.where(live, torch.exp(z - torch.where(live, lse.to(dt), 0.0)), 0.0)
    return (-(p_sink * delta).sum((0, 2))).to(device=sinks.device, dtype=sinks.dtype)
