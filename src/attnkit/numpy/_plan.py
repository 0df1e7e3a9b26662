"""How :func:`attnkit.numpy.flash_attention` splits its work: which tiles, on how many threads.

The algorithm itself (the online softmax over one block of queries) is in
:mod:`attnkit.numpy.flash`; this module only decides where it runs:

- :func:`key_tiles`: the key blocks one query block must visit, with the keep-mask of each
  (blocks outside the causal/window band, or whose keys share no segment with the queries,
  are skipped, not masked);
- :func:`plan` and :func:`run_blocks`: tile sizes and worker threads.

Two choices matter for speed on a CPU, and neither should be the caller's chore:

- **Tile size.** Every tile costs a fixed amount of Python and ufunc dispatch, and its
  matmuls run faster the longer their sides; tiles too large fall out of cache and leave too
  few query blocks to share among the workers. ``benchmarks/numpy_tiles.py`` measures them
  against torch's CPU SDPA (B=1, H=8, D=64, float32, 2 cores; its entries of 2026-11-23 in
  BENCHMARKS.md): 256 queries x 512 keys was within noise of the best tile at T = 1024,
  2048 and 4096 (1.42-1.58x torch), 128 x 256 0.07-0.18x behind it, 512 x 512 behind at 4096.
  The large tile is taken once every worker gets two query blocks of it; below that, 128 x
  256 keeps the workers busy. 64 x 64 cost about 45% more CPU time at T = 4096. Short
  sequences simply get one tile.
- **Threads.** Query blocks are independent, and NumPy releases the GIL inside BLAS and
  ufuncs, so one worker per usable core runs them in parallel. BLAS must then run one
  thread per worker: its own threads inside each worker oversubscribe the cores (measured
  3-9x slower on a busy 2-core machine). That limit is set for the duration of the call
  through ``threadpoolctl``; without it, the automatic choice stays at one thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BLOCK_K", "BLOCK_Q", "LARGE_BLOCK_K", "LARGE_BLOCK_Q", "Plan", "blas_threads_limited",
    "key_tiles", "plan", "run_blocks", "usable_cores",
]

BLOCK_Q = 128  # query rows per tile
BLOCK_K = 256  # keys per tile
LARGE_BLOCK_Q = 256  # the tile once each worker has enough query blocks of this size
LARGE_BLOCK_K = 512
BLOCKS_PER_WORKER = 2  # query blocks each worker needs before the large tile pays


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _can_limit_blas() -> bool:
    try:
        import threadpoolctl  # noqa: F401  (optional: limits BLAS threads per call)
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Plan:
    """Tile sizes and worker count of one call."""

    block_q: int
    block_k: int
    threads: int

    @property
    def limit_blas(self) -> bool:
        """Run BLAS single-threaded inside the workers (only when there are several)."""
        return self.threads > 1


def plan(
    Tq: int, Tk: int, block_q: int | None, block_k: int | None, num_threads: int | None
) -> Plan:
    """Fill in what the caller left as None.

    Args:
        Tq, Tk: query and key lengths.
        block_q, block_k: tile sizes, or None for :data:`LARGE_BLOCK_Q` x
            :data:`LARGE_BLOCK_K` when ``Tq`` gives every worker
            :data:`BLOCKS_PER_WORKER` blocks of them, else :data:`BLOCK_Q` x
            :data:`BLOCK_K` (clipped to the lengths, so a short sequence is one tile).
        num_threads: workers, or None for one per usable core, at most one per query
            block, and one when BLAS threads cannot be limited.

    Raises:
        ValueError: a given size or count below 1.
    """
    for name, value in (("block_q", block_q), ("block_k", block_k), ("num_threads", num_threads)):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
            kind = "thread counts" if name == "num_threads" else "block sizes"
            raise ValueError(f"{kind} must be positive integers or None, got {name}={value!r}")
    workers = int(num_threads) if num_threads is not None else (
        usable_cores() if _can_limit_blas() else 1)
    large = Tq >= BLOCKS_PER_WORKER * workers * LARGE_BLOCK_Q
    bq = int(block_q) if block_q is not None else max(
        1, min(LARGE_BLOCK_Q if large else BLOCK_Q, Tq))
    bk = int(block_k) if block_k is not None else max(
        1, min(LARGE_BLOCK_K if large else BLOCK_K, Tk))
    threads = workers if num_threads is not None else min(workers, max(1, -(-Tq // bq)))
    return Plan(bq, bk, threads)


@contextlib.contextmanager
def blas_threads_limited(active: bool) -> Iterator[None]:
    """BLAS at one thread for the body when ``active`` and ``threadpoolctl`` is installed
    (the caller's own setting comes back afterwards); otherwise does nothing."""
    if not active or not _can_limit_blas():
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def run_blocks(work: Plan, one_block: Callable[[int], None], starts: Iterable[int]) -> None:
    """``one_block(i0)`` for every query block start, on ``work.threads`` threads (query
    blocks are independent, and NumPy releases the GIL inside BLAS and ufuncs), with BLAS
    at one thread per worker while there are several."""
    starts = list(starts)
    if work.threads > 1 and len(starts) > 1:
        with blas_threads_limited(work.limit_blas), ThreadPoolExecutor(work.threads) as pool:
            list(pool.map(one_block, starts))
    else:
        for i0 in starts:
            one_block(i0)


def _band(
    i0: int, i1: int, j0: int, j1: int, offset: int, left: int | None, right: int | None
) -> np.ndarray | None:
    """Keep-mask of the tile rows ``[i0, i1)`` x cols ``[j0, j1)``, or None if all kept."""
    i = np.arange(i0, i1)[:, None] + offset  # the diagonal key of each query
    j = np.arange(j0, j1)[None, :]
    keep = np.ones((i1 - i0, j1 - j0), dtype=bool)
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    return None if keep.all() else keep


def key_tiles(
    i0: int, i1: int, Tq: int, Tk: int, block_k: int, left: int | None, right: int | None,
    same_segment: np.ndarray | None = None,
) -> Iterator[tuple[int, int, np.ndarray | None]]:
    """The key blocks ``[j0, j1)`` that queries ``[i0, i1)`` must visit, as
    ``(j0, j1, keep)``: ``keep`` is the tile's bool mask (True = may attend), None when
    every pair of the tile may attend.

    Only blocks that meet the band ``[i0 + offset - left, i1 - 1 + offset + right]`` are
    visited (``offset = Tk - Tq``, bottom-right alignment: query ``i``'s diagonal key is
    ``i + offset``; None = unbounded side), and of those only the ones where some query
    and key share a segment (``same_segment``: bool ``(..., Tq, Tk)``, or None).
    """
    offset = Tk - Tq
    j_lo = 0 if left is None else max(0, i0 + offset - left)
    j_hi = Tk if right is None else min(Tk, i1 - 1 + offset + right + 1)
    for j0 in range((j_lo // block_k) * block_k, j_hi, block_k):
        j1 = min(j0 + block_k, Tk)
        keep = _band(i0, i1, j0, j1, offset, left, right)
        if same_segment is not None:
            seg = same_segment[..., i0:i1, j0:j1]
            if not seg.any():
                continue
            keep = seg if keep is None else seg & keep
            keep = None if keep.all() else keep
        yield j0, j1, keep
