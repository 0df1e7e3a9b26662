"""Which chunks of the sequence each rank holds, and which blocks it computes at each ring step.

The sequence of length ``T`` is cut into equal chunks. Two layouts:

- ``"zigzag"`` (default): ``2P`` chunks; rank ``r`` holds chunks ``r`` and ``2P-1-r``. Under a
  causal mask every rank then does the same work at every ring step.
- ``"contiguous"``: ``P`` chunks; rank ``r`` holds chunk ``r``. Under a causal mask rank
  ``P-1`` does about ``2P-1`` times the work of rank 0; kept for comparison.

A rank's local sequence is its chunks concatenated in ascending order, so local order is
global order. At ring step ``s`` rank ``r`` holds the keys/values of rank ``(r - s) mod P``
and computes the blocks this module lists: pure functions of integers, used by the ring
itself, by the tests and by the benchmark (FLOPs per rank come from here).

Chunk pair classes under a causal mask, for query chunk ``a`` and key chunk ``b`` (chunks of
equal length, so the bottom-right diagonal of the pair is its main diagonal)::

    b < a   every key precedes every query      -> full block
    b == a  the diagonal chunk                 -> causal block
    b > a   every key follows every query      -> skipped (never computed)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Block",
    "Layout",
    "chunk_ids",
    "flops_per_rank",
    "num_chunks",
    "step_blocks",
]

Layout = Literal["zigzag", "contiguous"]
LAYOUTS: tuple[str, ...] = ("zigzag", "contiguous")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def num_chunks(layout: Layout, world_size: int) -> int:
    """How many chunks the global sequence is cut into: ``2P`` (zigzag) or ``P`` (contiguous)."""
    check_layout(layout)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 2 * world_size if layout == "zigzag" else world_size


def chunk_ids(layout: Layout, world_size: int, rank: int) -> tuple[int, ...]:
    """The global chunk indices rank ``rank`` holds, ascending (local order = global order)."""
    n = num_chunks(layout, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if layout == "zigzag":
        return (rank, n - 1 - rank)
    return (rank,)


@dataclass(frozen=True)
class Block:
    """One attention call of a ring step, in local element indices.

    Queries ``[q0, q1)`` of this rank attend to keys ``[k0, k1)`` of the visiting K/V block;
    ``causal`` means a causal mask on the block (it is square then), else no mask.
    """

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool

    def pairs(self) -> int:
        """Allowed (query, key) pairs: ``Lq*Lk``, or ``L*(L+1)/2`` for a causal block."""
        lq, lk = self.q1 - self.q0, self.k1 - self.k0
        return lq * (lq + 1) // 2 if self.causal else lq * lk


def step_blocks(
    layout: Layout, world_size: int, rank: int, src: int, chunk_len: int, *, causal: bool
) -> list[Block]:
    """The blocks rank ``rank`` computes against the K/V that rank ``src`` holds.

    Adjacent blocks of the same kind are coalesced into one call: in the zigzag layout every
    step is a single call (``2c x 2c`` causal on the own block, ``2c x c`` or ``c x 2c``
    full on the others), so a step does ``2c^2 + O(c)`` pairs on every rank.

    Args:
        layout: ``"zigzag"`` or ``"contiguous"``.
        world_size: ``P``.
        rank: the rank holding the queries.
        src: the rank whose keys/values are visiting.
        chunk_len: ``c``, elements per chunk.
        causal: whether the global causal mask applies.

    Returns:
        Blocks in local element indices; empty when every pair is masked.
    """
    q_chunks = chunk_ids(layout, world_size, rank)
    k_chunks = chunk_ids(layout, world_size, src)
    nq, nk, c = len(q_chunks), len(k_chunks), chunk_len
    if not causal:
        return [Block(0, nq * c, 0, nk * c, False)]
    if src == rank:
        # Local order is global order, so the whole local block is one causal square.
        return [Block(0, nq * c, 0, nk * c, True)]

    # Rectangles in chunk units: per query chunk, runs of full key chunks, and diagonals.
    rects: list[list[int | bool]] = []
    for i, a in enumerate(q_chunks):
        j = 0
        while j < nk:
            b = k_chunks[j]
            if b == a:
                rects.append([i, i + 1, j, j + 1, True])
                j += 1
            elif b < a:
                j1 = j
                while j1 < nk and k_chunks[j1] < a:
                    j1 += 1
                rects.append([i, i + 1, j, j1, False])
                j = j1
            else:
                j += 1
    # Stack full rectangles over the same key run from consecutive query chunks.
    merged: list[list[int | bool]] = []
    for r in rects:
        for m in merged:
            if not r[4] and not m[4] and m[2:4] == r[2:4] and m[1] == r[0]:
                m[1] = r[1]
                break
        else:
            merged.append(list(r))
    return [Block(i0 * c, i1 * c, j0 * c, j1 * c, bool(cz)) for i0, i1, j0, j1, cz in merged]


def flops_per_rank(
    layout: Layout,
    world_size: int,
    seq_len: int,
    *,
    causal: bool,
    batch: int = 1,
    heads: int = 1,
    head_dim: int = 64,
    exact: bool = True,
) -> list[int]:
    """Forward attention FLOPs each rank spends over a whole ring pass.

    ``4 * B * H * D`` per allowed (query, key) pair (two matmuls, 2 FLOPs per
    multiply-add). With ``exact=False`` a causal block counts half of ``L^2`` pairs (the
    usual convention for causal FLOPs) instead of ``L(L+1)/2``. Backward is 2.5x this.

    Returns:
        One entry per rank.
    """
    n = num_chunks(layout, world_size)
    if seq_len % n:
        raise ValueError(
            f"seq_len {seq_len} is not divisible by {n} chunks ({layout}, P={world_size})"
        )
    c = seq_len // n
    per = 4 * batch * heads * head_dim
    out = []
    for rank in range(world_size):
        total = 0
        for s in range(world_size):
            src = (rank - s) % world_size
            for blk in step_blocks(layout, world_size, rank, src, c, causal=causal):
                lq = blk.q1 - blk.q0
                total += blk.pairs() if exact or not blk.causal else lq * lq // 2
        out.append(per * total)
    return out
