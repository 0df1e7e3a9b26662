"""Cut a sequence into this rank's shard, and gather the shards back (differentiably).

Layouts are described in :mod:`attnkit.distributed.schedule`. The sequence length must be
divisible by the number of chunks (``2P`` for zigzag, ``P`` for contiguous); anything else
is rejected with a ``ValueError`` rather than padded, so no hidden padding can change a
result. Pad the sequence yourself and pass ``valid_lens`` to :func:`ring_attention` to
mask the padded keys. An empty sequence (length 0) is divisible by anything: every rank
gets an empty shard, and gathering empty shards gives the empty sequence back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .schedule import Layout, chunk_ids, num_chunks

__all__ = ["gather_sequence", "group_info", "shard_sequence"]


def group_info(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, world_size)`` in ``group``; ``(0, 1)`` when no process group is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _split(x: torch.Tensor, dim: int, n: int) -> list[torch.Tensor]:
    T = x.shape[dim]
    if T % n:
        raise ValueError(
            f"sequence length {T} (dim {dim} of shape {tuple(x.shape)}) is not divisible by "
            f"{n} chunks; pad it to a multiple of {n} and mask the padding (valid_lens)"
        )
    if T == 0:  # torch.split cannot cut chunks of length 0: n empty ones, by hand
        return [x.narrow(dim, 0, 0)] * n
    return list(torch.split(x, T // n, dim=dim))


def shard_sequence(
    x: torch.Tensor,
    *,
    dim: int = -2,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
) -> torch.Tensor:
    """This rank's shard of a sequence that every rank holds in full.

    Args:
        x: the full tensor, sequence along ``dim`` (``(B, H, T, D)`` with ``dim=-2``, or
            ``(B, T, E)`` with ``dim=1``).
        dim: the sequence axis.
        group: the process group (default: the world; none initialised = one rank).
        layout: ``"zigzag"`` (rank ``r`` holds chunks ``r`` and ``2P-1-r`` of ``2P``) or
            ``"contiguous"`` (rank ``r`` holds chunk ``r`` of ``P``).

    Returns:
        ``x`` with ``T/P`` entries along ``dim`` (a new tensor; ``x`` is not modified);
        empty along ``dim`` when ``T = 0``.
    """
    rank, P = group_info(group)
    chunks = _split(x, dim, num_chunks(layout, P))
    return torch.cat([chunks[i] for i in chunk_ids(layout, P, rank)], dim=dim)


def _unshard(shards: list[torch.Tensor], dim: int, layout: Layout) -> torch.Tensor:
    """Put every rank's shard back in global order."""
    P = len(shards)
    n_local = len(chunk_ids(layout, P, 0))
    pieces: list[torch.Tensor | None] = [None] * num_chunks(layout, P)
    for r, shard in enumerate(shards):
        for cid, piece in zip(chunk_ids(layout, P, r), torch.chunk(shard, n_local, dim=dim)):
            pieces[cid] = piece
    return torch.cat(pieces, dim=dim)  # type: ignore[arg-type]


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_shard, dim, group, layout):  # type: ignore[override]
        ctx.dim, ctx.group, ctx.layout = dim, group, layout
        _, P = group_info(group)
        x_shard = x_shard.contiguous()
        shards = [torch.empty_like(x_shard) for _ in range(P)]
        dist.all_gather(shards, x_shard, group=group)
        return _unshard(shards, dim, layout)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # Every rank used the full tensor, so a shard's gradient is the sum over ranks.
        grad = grad.clone(memory_format=torch.contiguous_format)  # all_reduce works in place
        dist.all_reduce(grad, group=ctx.group)
        shard = shard_sequence(grad, dim=ctx.dim, group=ctx.group, layout=ctx.layout)
        return shard, None, None, None


def gather_sequence(
    x_shard: torch.Tensor,
    *,
    dim: int = -2,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "zigzag",
) -> torch.Tensor:
    """The full sequence on every rank, from each rank's shard (inverse of :func:`shard_sequence`).

    Differentiable: the gradient of a shard is the sum over ranks of the gradient of the
    full tensor at that shard's positions (an all-reduce).

    Args:
        x_shard: this rank's shard, ``T/P`` entries along ``dim``; every rank's shard must
            have the same shape.
        dim, group, layout: as in :func:`shard_sequence`.

    Returns:
        The full tensor, ``T`` entries along ``dim``, in global order.
    """
    _, P = group_info(group)
    n_local = len(chunk_ids(layout, P, 0))
    if x_shard.shape[dim] % n_local:
        raise ValueError(
            f"shard length {x_shard.shape[dim]} (dim {dim} of shape {tuple(x_shard.shape)}) is "
            f"not divisible by the {n_local} chunks per rank of the {layout} layout"
        )
    if P == 1:
        return x_shard
    if x_shard.shape[dim] == 0:  # an empty sequence: nothing to gather (same on every rank)
        return x_shard.clone()
    return _GatherSequence.apply(x_shard, dim, group, layout)
