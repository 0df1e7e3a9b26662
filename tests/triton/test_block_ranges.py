"""The block-range arithmetic that lets the kernels skip work, checked exhaustively.

For a query block the forward and dQ kernels visit key blocks ``[lo, hi)`` and apply no
mask in ``[full_lo, full_hi)``; the dK/dV kernel does the mirror image over query blocks.
A wrong bound silently drops or double-counts keys only for some shapes, so the bounds are
computed by the very ``@triton.jit`` helpers the kernels use and compared with a brute-force
keep-mask over many random shapes, windows and tile sizes.
"""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


K = None  # attnkit.triton._kernels, bound by the fixture below (not at collection)


def _ranges_kernel(OUT, T_other, diag_off, left, right, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   BY_KEYS: tl.constexpr):
    pid = tl.program_id(0)
    if BY_KEYS:  # ranges over key blocks for query block pid
        lo, full_lo, full_hi, hi = K._key_ranges(pid * BLOCK_M, T_other, diag_off, left, right,
                                                 BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    else:  # ranges over query blocks for key block pid
        lo, full_lo, full_hi, hi = K._query_ranges(pid * BLOCK_N, T_other, diag_off, left,
                                                   right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                                   HAS_RIGHT)
    tl.store(OUT + pid * 4 + 0, lo)
    tl.store(OUT + pid * 4 + 1, full_lo)
    tl.store(OUT + pid * 4 + 2, full_hi)
    tl.store(OUT + pid * 4 + 3, hi)


@pytest.fixture(scope="module")
def ranges_kernel():
    global K
    from attnkit.triton import _kernels

    K = _kernels
    return triton.jit(_ranges_kernel)


def _keep(Tq, Tk, left, right):
    i = torch.arange(Tq)[:, None] + (Tk - Tq)
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    return keep


def _shapes(n, seed):
    rnd = random.Random(seed)
    for _ in range(n):
        Tq, Tk = rnd.randint(1, 80), rnd.randint(1, 80)
        left = rnd.choice([None, rnd.randint(-10, 90)])
        right = rnd.choice([None, rnd.randint(-90, 10), 0])
        bm, bn = rnd.choice([16, 32]), rnd.choice([16, 32])
        yield Tq, Tk, left, right, bm, bn


def _visited(ranges, step, total):
    """Blocks visited once in masked passes / once unmasked, as index sets."""
    lo, full_lo, full_hi, hi = ranges
    masked = list(range(lo, full_lo, step)) + list(range(full_hi, hi, step))
    full = list(range(full_lo, full_hi, step))
    return masked, full


@pytest.mark.parametrize("by_keys", [True, False], ids=["key_blocks", "query_blocks"])
def test_ranges_cover_the_band_once_and_full_blocks_need_no_mask(by_keys, ranges_kernel):
    for Tq, Tk, left, right, bm, bn in _shapes(250, seed=int(by_keys)):
        keep = _keep(Tq, Tk, left, right)
        n_prog = triton.cdiv(Tq, bm) if by_keys else triton.cdiv(Tk, bn)
        out = torch.empty(n_prog * 4, dtype=torch.int32, device=DEVICE)
        ranges_kernel[(n_prog,)](
            out, Tk if by_keys else Tq, Tk - Tq, 0 if left is None else left,
            0 if right is None else right, BLOCK_M=bm, BLOCK_N=bn,
            HAS_LEFT=left is not None, HAS_RIGHT=right is not None, BY_KEYS=by_keys)
        out = out.cpu().view(n_prog, 4).tolist()
        where = f"Tq={Tq} Tk={Tk} window=({left}, {right}) tiles={bm}x{bn}"
        for p, ranges in enumerate(out):
            if by_keys:
                rows = keep[p * bm:(p + 1) * bm]  # (<= bm, Tk)
                step, total = bn, Tk
            else:
                rows = keep[:, p * bn:(p + 1) * bn].T  # (<= bn, Tq)
                step, total = bm, Tq
            masked, full = _visited(ranges, step, total)
            blocks = masked + full
            assert len(blocks) == len(set(blocks)), f"block visited twice: {where}"
            assert all(b % step == 0 and 0 <= b < total for b in blocks), where
            needed = {c // step * step for c in rows.any(0).nonzero().flatten().tolist()}
            assert needed <= set(blocks), f"allowed pairs skipped: {where}, prog {p}"
            for b in full:  # no mask applied: every pair must be allowed, in range
                assert b + step <= total and rows[:, b:b + step].all(), (
                    f"unmasked block {b} holds a masked pair: {where}, prog {p}")
