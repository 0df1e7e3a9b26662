"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Every rank holds ``T/P`` queries, keys and values (in a layout from
:mod:`attnkit.distributed.schedule`). The K/V shards travel around the ring: at step ``s``
rank ``r`` holds the K/V of rank ``(r - s) mod P``, computes its queries against them and
merges the partial result into its running ``(out, lse)`` by log-sum-exp. While it
computes, the same K/V buffer is already on its way to rank ``r + 1`` and the next one is
arriving from rank ``r - 1`` (``batch_isend_irecv``), so communication hides behind
compute once the blocks are long enough (see ``docs/distributed.md``).

Backward runs the same ring again. Each rank recomputes its blocks' probabilities from the
final LSE, adds its dQ locally, and adds its share of dK/dV to an accumulator that travels
*with* the K/V block; after ``P`` hops that accumulator reaches the block's owner, holding
the sum over every rank's queries.

Under a causal mask, blocks that lie wholly above the diagonal are skipped; with the
default zigzag layout every rank then does the same work at every step.

Before the first transfer the ranks exchange one small int64 vector each (shapes, dtypes,
layout, causal, the valid_lens range): shards that disagree raise the same ``ValueError``,
naming every rank's shapes, on every rank. Otherwise a rank would send a buffer of another
size or layout than its peer expects: gloo aborts the process, or, when only the byte
counts agree, the ring runs to completion on misread data.

Precision: the running LSE is float64 (the blocks' float32 row max and sum added without
rounding at the LSE's magnitude) and merges normalise by the sum of their weights, so
float32 results match plain float32 math at logits ~1e4, where a float32 LSE is only good to
5e-4. NaN/inf in a causally masked (future) position reaches no output or gradient
(:mod:`attnkit.torch.lse`).

Variants: ``softcap`` and ``segment_ids`` apply inside every block (the segment ids of
all ranks are gathered once per pass, a few bytes per token, so each rank knows the ids
of the K/V block visiting it); ``sinks`` join once per row, as one more partial (output 0,
LSE ``sink``) merged after the last step, and their gradient is each rank's share
(:func:`attnkit.torch.lse.sinks_backward`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..spec import (
    check_causal,
    check_length_range,
    check_segment_ids,
    check_sinks,
    check_softcap,
    default_scale,
)
from ..torch._checks import check_qkv
from ..torch._dtypes import stats_dtype
from ..torch.lse import attention_with_lse, attention_with_lse_backward, sinks_backward
from .agreement import agree
from .merge import merge_partials
from .schedule import Layout, check_layout, chunk_ids, num_chunks, step_blocks
from .sharding import group_info

__all__ = ["ring_attention", "ring_attention_backward", "ring_attention_forward"]

# Distinct tags keep the K/V and dK/dV messages apart on gloo (NCCL matches by issue order,
# which is the same on every rank).
_TAG_KV, _TAG_DKV = 0, 1


class _Exchange:
    """One in-flight "send to next, receive from previous" pair. Keeps the send buffer alive."""

    def __init__(
        self, send: torch.Tensor, nxt: int, prev: int, group: dist.ProcessGroup | None, tag: int
    ) -> None:
        self.send = send
        self.recv = torch.empty_like(send)
        self.works = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, send, nxt, group, tag),
                dist.P2POp(dist.irecv, self.recv, prev, group, tag),
            ]
        )

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        return self.recv


class _Ring:
    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank, self.size = group_info(group)
        if self.size > 1:
            g = group if group is not None else dist.group.WORLD
            self.next = dist.get_global_rank(g, (self.rank + 1) % self.size)
            self.prev = dist.get_global_rank(g, (self.rank - 1) % self.size)

    def exchange(self, send: torch.Tensor, tag: int) -> _Exchange:
        return _Exchange(send, self.next, self.prev, self.group, tag)


def _pack(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One flat buffer, so a K/V (or dK/dV) block travels as one message."""
    return torch.cat([a.reshape(-1), b.reshape(-1)])


def _unpack(
    buf: torch.Tensor, shape_a: torch.Size, shape_b: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    n = shape_a.numel()
    return buf[:n].view(shape_a), buf[n:].view(shape_b)


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
    world_size: int,
    valid_lens: torch.Tensor | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: object = None,
) -> int:
    """Validate shards (and the variants' arguments); return the chunk length ``c``."""
    check_layout(layout)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    try:
        check_qkv(q, k, v, batched=True)
    except ValueError as e:  # name every shard, whichever pair the rule compared
        raise ValueError(f"ring_attention shards {shapes}: {e}") from None
    B, T = q.shape[0], q.shape[2]
    if k.shape[2] != T:
        raise ValueError(f"q and k/v shards must have the same length T/P: {shapes}")
    check_softcap(softcap)
    check_sinks(sinks, q.shape[1])
    if segment_ids is not None:
        try:
            check_segment_ids(segment_ids, (B, q.shape[1], T, T))
        except (ValueError, TypeError) as e:  # say that these are shards of the ids
            raise type(e)(f"ring_attention segment_ids shard (this rank's T/P = {T} "
                          f"positions, from shard_sequence(ids, dim=1)): {e}") from None
    n_local = len(chunk_ids(layout, world_size, 0))  # type: ignore[arg-type]
    if T % n_local:
        n = num_chunks(layout, world_size)  # type: ignore[arg-type]
        raise ValueError(
            f"shard length T/P={T} is not divisible by the {n_local} chunks per rank of the "
            f"{layout} layout: the sequence length T={T * world_size} must be a multiple of "
            f"{n} (pad it and pass valid_lens to mask the padding)"
        )
    if valid_lens is not None:
        if valid_lens.shape != (B,) or valid_lens.is_floating_point() or valid_lens.is_complex():
            raise ValueError(
                f"valid_lens must be an integer tensor of shape (B,) = ({B},), got "
                f"{valid_lens.dtype} {tuple(valid_lens.shape)}"
            )
        if valid_lens.numel():
            lo, hi = torch.stack(torch.aminmax(valid_lens)).tolist()  # one host sync
            check_length_range(lo, hi, T * world_size, of="the sequence length T")
    return T // n_local


def _key_mask(
    valid_lens: torch.Tensor | None, layout: Layout, P: int, src: int, c: int,
    device: torch.device,
) -> torch.Tensor | None:
    """``(B, T/P)`` True where a key of rank ``src``'s shard lies before ``valid_lens``."""
    if valid_lens is None:
        return None
    pos = torch.cat(
        [torch.arange(i * c, (i + 1) * c, device=device) for i in chunk_ids(layout, P, src)]
    )
    return pos[None, :] < valid_lens.to(device)[:, None]


def _segment_ids_by_rank(
    segment_ids: object, ring: _Ring, device: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """``(q_ids (B, T/P), [kv_ids of rank r for r in the group])`` from this rank's shard
    of the ids (one ``(B, T/P)`` tensor, or a pair for queries and keys): the key ids of
    every rank come from one all-gather, since the K/V blocks visit every rank."""
    if segment_ids is None:
        return None
    pair = segment_ids if isinstance(segment_ids, (tuple, list)) else (segment_ids,) * 2
    q_ids, kv_ids = (torch.as_tensor(x, device=device) for x in pair)
    if ring.size == 1:
        return q_ids, [kv_ids]
    kv_ids = kv_ids.contiguous()
    every = [torch.empty_like(kv_ids) for _ in range(ring.size)]
    dist.all_gather(every, kv_ids, group=ring.group)
    return q_ids, every


def _block_ids(ids: tuple[torch.Tensor, list[torch.Tensor]] | None, src: int, blk) -> object:
    """The segment ids of one block: its query rows' and the visiting keys'."""
    if ids is None:
        return None
    return ids[0][:, blk.q0 : blk.q1], ids[1][src][:, blk.k0 : blk.k1]


@torch.no_grad()
def ring_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool | str = False,
    scale: float | None = None,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
    valid_lens: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ring pass returning this rank's output shard and its LSE (not differentiable).

    Arguments as in :func:`ring_attention`.

    Returns:
        ``(out (B, H, T/P, Dv) in q's dtype, lse (B, H, T/P))``: ``lse`` is natural-log,
        float64 (the float32 row statistics carried without rounding them at the LSE's
        magnitude: what :func:`ring_attention_backward` needs at large logits), ``-inf``
        where a row has no allowed key.
    """
    ring = _Ring(group)
    P, rank = ring.size, ring.rank
    agree(ring.group, ring.size, q, k, v, layout, causal, valid_lens, softcap, sinks,
          segment_ids)
    c = _check_inputs(q, k, v, layout, P, valid_lens, softcap, sinks, segment_ids)
    causal = check_causal(causal) is not None  # Tq == Tk: both alignments agree
    scale = default_scale(scale, q.shape[-1])
    ids = _segment_ids_by_rank(segment_ids, ring, q.device)
    B, H, T, _ = q.shape
    dt = stats_dtype(q.dtype)
    out = torch.zeros(B, H, T, v.shape[-1], dtype=dt, device=q.device)
    # float64 LSE: see the module notes (a float32 one is only good to 5e-4 at 1e4).
    lse = torch.full((B, H, T), -math.inf, dtype=torch.float64, device=q.device)

    kv = _pack(k, v)
    for s in range(P):
        src = (rank - s) % P
        pending = ring.exchange(kv, _TAG_KV) if s < P - 1 else None  # overlaps the compute
        kb, vb = _unpack(kv, k.shape, v.shape)
        km = _key_mask(valid_lens, layout, P, src, c, q.device)
        for blk in step_blocks(layout, P, rank, src, c, causal=causal):
            o, l = attention_with_lse(
                q[:, :, blk.q0 : blk.q1],
                kb[:, :, blk.k0 : blk.k1],
                vb[:, :, blk.k0 : blk.k1],
                causal=blk.causal,
                scale=scale,
                key_mask=None if km is None else km[:, blk.k0 : blk.k1],
                softcap=softcap,
                segment_ids=_block_ids(ids, src, blk),
                lse_dtype=torch.float64,
            )
            rows = slice(blk.q0, blk.q1)
            out[:, :, rows], lse[:, :, rows] = merge_partials(
                out[:, :, rows], lse[:, :, rows], o.to(dt), l
            )
        if pending is not None:
            kv = pending.wait()
    if sinks is not None:  # once per row: a partial with output 0 and LSE sink[h]
        z = sinks.to(device=q.device, dtype=dt)[None, :, None].expand(B, H, T)
        out, lse = merge_partials(out, lse, torch.zeros_like(out), z)
    return out.to(q.dtype), lse


@torch.no_grad()
def ring_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool | str = False,
    scale: float | None = None,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
    valid_lens: torch.Tensor | None = None,
    softcap: float | None = None,
    segment_ids: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward ring pass: gradients of this rank's q, k, v shards.

    Args:
        dout: ``(B, H, T/P, Dv)`` gradient of this rank's output shard.
        q, k, v: this rank's shards, as given to :func:`ring_attention_forward`.
        out, lse: what :func:`ring_attention_forward` returned for them (``lse`` in
            float64 keeps the gradients exact at large logits; float32 is accepted).
        causal, scale, group, layout, valid_lens, softcap, segment_ids: as in the forward.
            Sinks need no argument: ``lse`` holds them (their own gradient:
            :func:`attnkit.torch.lse.sinks_backward`).

    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q, k, v``. dK/dV are accumulated in
        float32 (float64) while they travel, and cast at the end.
    """
    ring = _Ring(group)
    P, rank = ring.size, ring.rank
    agree(ring.group, ring.size, q, k, v, layout, causal, valid_lens, softcap, None,
          segment_ids)
    c = _check_inputs(q, k, v, layout, P, valid_lens, softcap, None, segment_ids)
    causal = check_causal(causal) is not None
    scale = default_scale(scale, q.shape[-1])
    ids = _segment_ids_by_rank(segment_ids, ring, q.device)
    dt = stats_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=dt, device=q.device)

    kv = _pack(k, v)
    dkv_pending: _Exchange | None = None
    for s in range(P):
        src = (rank - s) % P
        kv_pending = ring.exchange(kv, _TAG_KV) if s < P - 1 else None
        kb, vb = _unpack(kv, k.shape, v.shape)
        km = _key_mask(valid_lens, layout, P, src, c, q.device)
        dk_blk = torch.zeros(k.shape, dtype=dt, device=q.device)
        dv_blk = torch.zeros(v.shape, dtype=dt, device=q.device)
        for blk in step_blocks(layout, P, rank, src, c, causal=causal):
            rows, keys = slice(blk.q0, blk.q1), slice(blk.k0, blk.k1)
            dq_p, dk_p, dv_p = attention_with_lse_backward(
                dout[:, :, rows],
                q[:, :, rows],
                kb[:, :, keys],
                vb[:, :, keys],
                out[:, :, rows],
                lse[:, :, rows],
                causal=blk.causal,
                scale=scale,
                key_mask=None if km is None else km[:, keys],
                softcap=softcap,
                segment_ids=_block_ids(ids, src, blk),
            )
            dq[:, :, rows] += dq_p
            dk_blk[:, :, keys] += dk_p
            dv_blk[:, :, keys] += dv_p
        dkv = _pack(dk_blk, dv_blk)
        if dkv_pending is not None:
            # The accumulator for this K/V block from the ranks it visited before.
            dkv = dkv + dkv_pending.wait()
        if P > 1:
            dkv_pending = ring.exchange(dkv, _TAG_DKV)
        if kv_pending is not None:
            kv = kv_pending.wait()
    if dkv_pending is not None:
        # After P hops the accumulator of this rank's own K/V block has come home.
        dkv = dkv_pending.wait()
    dk, dv = _unpack(dkv, k.shape, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, group, layout, valid_lens, softcap,  # type: ignore[override]
                segment_ids):
        out, lse = ring_attention_forward(
            q, k, v, causal=causal, scale=scale, group=group, layout=layout,
            valid_lens=valid_lens, softcap=softcap, sinks=sinks, segment_ids=segment_ids,
        )
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.opts = dict(causal=causal, scale=scale, group=group, layout=layout,
                        valid_lens=valid_lens, softcap=softcap, segment_ids=segment_ids)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = ring_attention_backward(dout, q, k, v, out, lse, **ctx.opts)
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            dsinks = sinks_backward(dout, out, lse, sinks)  # this rank's rows' share
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool | str = False,
    scale: float | None = None,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
    valid_lens: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Exact attention over a sequence sharded across ``group``; differentiable.

    Every rank calls this with its own shards (from :func:`shard_sequence` with the same
    ``layout``); shapes must be equal on every rank. Without an initialised process group
    it is plain attention on one rank.

    Args:
        q: ``(B, H, T/P, Dk)`` this rank's queries.
        k: ``(B, Hkv, T/P, Dk)`` this rank's keys (GQA/MQA when ``Hkv < H``).
        v: ``(B, Hkv, T/P, Dv)`` this rank's values.
        causal: causal mask over *global* positions (query ``i`` sees key ``j <= i``;
            ``"top_left"`` and ``"bottom_right"`` agree, since ``Tq == Tk``).
        scale: defaults to ``1/sqrt(Dk)``.
        group: process group (default: the world).
        layout: ``"zigzag"`` (balanced under causal) or ``"contiguous"``.
        valid_lens: optional integer ``(B,)``: only global key positions ``j < valid_lens[b]``
            may be attended (for padded sequences). A row left with no allowed key gets
            output 0 and zero gradients.
        softcap: ``softcap * tanh(s / softcap)`` on the scaled scores (None = off).
        sinks: ``(H,)`` float logits, the same on every rank (a replicated parameter): a
            value-less column in each softmax denominator. Each rank's ``sinks.grad`` is
            its own rows' share; sum it over the group (as for any replicated weight under
            sequence parallelism, e.g. by the data-parallel all-reduce).
        segment_ids: this rank's shard of the ids, int ``(B, T/P)`` (or a pair for
            queries and keys), cut like q/k/v: ``shard_sequence(ids, dim=1, layout=...)``.
            Equal ids attend each other (packed documents); an id < 0 attends nothing.

    Returns:
        ``(B, H, T/P, Dv)``: this rank's output shard, in q's dtype.

    Raises:
        ValueError: shapes disagree (on one rank, or between ranks: every rank raises,
            naming every rank's shapes), ``H % Hkv != 0``, or ``T`` is not a multiple of
            the layout's chunk count (``2P`` zigzag, ``P`` contiguous).
    """
    return _RingAttention.apply(q, k, v, sinks, causal, scale, group, layout, valid_lens,
                                softcap, segment_ids)
