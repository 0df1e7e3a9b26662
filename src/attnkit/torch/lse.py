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
gradients are 0. Masks are applied with ``-inf`` plus explicit guards.
"""

from __future__ import annotations

import math
from types import ModuleType

import torch

from ..spec import check_fused_head_dims, check_qkv
from ._dtypes import stats_dtype
from ._nonfinite import zero_masked_keys
from ._triton_path import triton_kernels

__all__ = ["attention_with_lse", "attention_with_lse_backward"]

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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
) -> ModuleType | None:
    """The fused kernels when they can take this block, else None (torch does the work)."""
    if key_mask is not None or not q.is_cuda or q.dtype not in _TRITON_DTYPES:
        return None
    if check_fused_head_dims(q.shape[-1], v.shape[-1]) is not None:
        return None
    return triton_kernels("flash_attention_forward", "flash_attention_backward")


def _neg_inf_guard(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-inf`` replaced by 0, to rebase exponentials of rows with no allowed key."""
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


def _tile_scores(
    qt: torch.Tensor,
    k: torch.Tensor,
    row0: int,
    offset: int,
    *,
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Scaled, masked scores of query rows ``[row0, row0 + Tt)``.

    ``qt`` is ``(B, Hkv, G, Tt, Dk)``, ``k`` is ``(B, Hkv, 1, Tk, Dk)``; returns
    ``(B, Hkv, G, Tt, Tk)`` with ``-inf`` at disallowed keys.
    """
    s = torch.matmul(qt, k.transpose(-1, -2)) * scale
    keep = None
    if causal:
        i = torch.arange(row0, row0 + qt.shape[-2], device=s.device)[:, None] + offset
        j = torch.arange(k.shape[-2], device=s.device)[None, :]
        keep = j <= i  # bottom-right aligned: query i sees key j iff j <= i + Tk - Tq
    if key_mask is not None:
        km = key_mask[:, None, None, None, :]  # (B, 1, 1, 1, Tk)
        keep = km if keep is None else keep & km
    if keep is not None:
        s = torch.where(keep, s, torch.full_like(s, -math.inf))
    return s


def _keys_seen(r1: int, Tq: int, Tk: int, causal: bool) -> int:
    """How many leading keys the query rows before ``r1`` can see (all of them without causal).

    Under the bottom-right causal mask row ``r1 - 1`` sees keys ``j <= r1 - 1 + Tk - Tq``;
    the keys after that are skipped, not masked, which halves the work of a causal block.
    """
    return Tk if not causal else max(0, min(Tk, r1 + Tk - Tq))


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q k^T * scale, masked) v`` and its natural-log LSE.

    Args:
        q: ``(B, H, Tq, Dk)``.
        k: ``(B, Hkv, Tk, Dk)``.
        v: ``(B, Hkv, Tk, Dv)``.
        causal: bottom-right aligned causal mask (query ``i`` sees key ``j <= i + Tk - Tq``).
        scale: multiplies the scores.
        key_mask: optional bool ``(B, Tk)``, True = may attend.

    Returns:
        ``(out (B, H, Tq, Dv) in the compute dtype, lse (B, H, Tq))``: compute dtype is
        float64 for float64 input, else float32; ``lse`` is natural-log, ``-inf`` where a
        row has no allowed key (its output is 0).
    """
    G = check_qkv(q, k, v, batched=True)
    ops = _use_triton(q, k, v, key_mask)
    if ops is not None:
        # Ring blocks are slices along T: hand the kernel dense tensors.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = ops.flash_attention_forward(q, k, v, causal=causal, scale=scale)
        return out.to(stats_dtype(q.dtype)), lse.float()

    dt = stats_dtype(q.dtype, k.dtype, v.dtype)
    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    qg = q.to(dt).reshape(B, Hkv, G, Tq, Dk)
    kg = k.to(dt).unsqueeze(2)  # (B, Hkv, 1, Tk, Dk): broadcasts over the G query heads
    vg = zero_masked_keys(v.to(dt), key_mask).unsqueeze(2)  # (B, Hkv, 1, Tk, Dv)
    if Tq == 0:
        return q.new_zeros((B, H, 0, Dv), dtype=dt), q.new_zeros((B, H, 0), dtype=dt)
    outs, lses = [], []
    tile = _row_tile(q, Tk)
    for r0 in range(0, Tq, tile):
        r1 = min(r0 + tile, Tq)
        j = _keys_seen(r1, Tq, Tk, causal)
        s = _tile_scores(
            qg[..., r0:r1, :], kg[..., :j, :], r0, Tk - Tq,
            causal=causal, scale=scale, key_mask=None if key_mask is None else key_mask[:, :j],
        )
        if j:
            m = s.amax(dim=-1, keepdim=True)
        else:  # no key visible to this tile at all
            m = s.new_full(s.shape[:-1] + (1,), -math.inf)
        p = torch.exp(s - _neg_inf_guard(m))  # exp(-inf) = 0 at masked keys
        l = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p, vg[..., :j, :])
        # l == 0 exactly when the row has no allowed key: output 0, lse -inf.
        empty = l == 0
        outs.append(torch.where(empty, torch.zeros_like(o), o / torch.where(empty, 1.0, l)))
        lse = torch.where(empty, -math.inf, m + torch.log(torch.where(empty, 1.0, l)))
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
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`attention_with_lse` given the *final* output and LSE of its
    query rows (which may cover more keys than ``k``: then these are one block's shares).

    With ``P = exp(s - lse)`` (normalised over all keys, not only this block's) and
    ``delta = rowsum(dout * out)``: ``dV = P^T dout``, ``dS = P * (dout V^T - delta)``,
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q``. Summing these over the blocks of a row
    gives the exact gradient of the full attention (one block: the exact gradient).

    Args:
        dout: ``(B, H, Tq, Dv)``.
        q, k, v: as in :func:`attention_with_lse`.
        out: ``(B, H, Tq, Dv)`` final output of these rows.
        lse: ``(B, H, Tq)`` final LSE of these rows (``-inf``: row fully masked, grads 0).
        causal, scale, key_mask: as in :func:`attention_with_lse`.

    Returns:
        ``(dq (B, H, Tq, Dk), dk (B, Hkv, Tk, Dk), dv (B, Hkv, Tk, Dv))`` in the compute
        dtype (float64 for float64 input, else float32).
    """
    G = check_qkv(q, k, v, batched=True)
    ops = _use_triton(q, k, v, key_mask)
    if ops is not None:
        dt = stats_dtype(q.dtype)
        dq, dk, dv = ops.flash_attention_backward(
            dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
            out.to(q.dtype).contiguous(), lse.float().contiguous(), causal=causal, scale=scale,
        )
        return dq.to(dt), dk.to(dt), dv.to(dt)

    dt = stats_dtype(q.dtype, k.dtype, v.dtype)
    B, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    qg = q.to(dt).reshape(B, Hkv, G, Tq, Dk)
    # Masked keys are zeroed too: their dS is 0, but dQ = dS K would still read 0 * NaN.
    kg = zero_masked_keys(k.to(dt), key_mask).unsqueeze(2)
    vg = zero_masked_keys(v.to(dt), key_mask).unsqueeze(2)
    dog = dout.to(dt).reshape(B, Hkv, G, Tq, Dv)
    og = out.to(dt).reshape(B, Hkv, G, Tq, Dv)
    lg = lse.to(dt).reshape(B, Hkv, G, Tq, 1)
    dq_tiles = [q.new_zeros((B, Hkv, G, 0, Dk), dtype=dt)]
    dk = torch.zeros(B, Hkv, Tk, Dk, dtype=dt, device=q.device)
    dv = torch.zeros(B, Hkv, Tk, Dv, dtype=dt, device=q.device)
    tile = _row_tile(q, Tk)
    for r0 in range(0, Tq, tile):
        r1 = min(r0 + tile, Tq)
        qt, dot, lt = qg[..., r0:r1, :], dog[..., r0:r1, :], lg[..., r0:r1, :]
        j = _keys_seen(r1, Tq, Tk, causal)
        kt, vt = kg[..., :j, :], vg[..., :j, :]
        s = _tile_scores(
            qt, kt, r0, Tk - Tq, causal=causal, scale=scale,
            key_mask=None if key_mask is None else key_mask[:, :j],
        )
        # A fully masked row has lse = -inf; its probabilities are 0, not exp(s + inf).
        dead = torch.isneginf(lt)
        p = torch.where(dead, torch.zeros_like(s), torch.exp(s - _neg_inf_guard(lt)))
        delta = (dot * og[..., r0:r1, :]).sum(dim=-1, keepdim=True)  # (B, Hkv, G, Tt, 1)
        dv[..., :j, :] += torch.matmul(p.transpose(-1, -2), dot).sum(dim=2)
        ds = p * (torch.matmul(dot, vt.transpose(-1, -2)) - delta)
        dq_tiles.append(torch.matmul(ds, kt) * scale)
        dk[..., :j, :] += torch.matmul(ds.transpose(-1, -2), qt).sum(dim=2) * scale
    dq = torch.cat(dq_tiles, dim=-2).reshape(B, H, Tq, Dk)
    return dq, dk, dv
