"""The block schedule: every allowed (query, key) pair is computed exactly once, and the
zigzag layout gives every rank the same work at every step."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.distributed import chunk_ids, flops_per_rank, num_chunks, step_blocks


def _global_positions(layout: str, P: int, rank: int, c: int) -> np.ndarray:
    return np.concatenate([np.arange(i * c, (i + 1) * c) for i in chunk_ids(layout, P, rank)])


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_every_allowed_pair_is_computed_exactly_once(layout, P, causal) -> None:
    c = 3
    T = num_chunks(layout, P) * c
    count = np.zeros((T, T), dtype=int)
    for rank in range(P):
        qpos = _global_positions(layout, P, rank, c)
        for s in range(P):
            src = (rank - s) % P
            kpos = _global_positions(layout, P, src, c)
            for b in step_blocks(layout, P, rank, src, c, causal=causal):
                qi, kj = qpos[b.q0 : b.q1], kpos[b.k0 : b.k1]
                keep = np.ones((len(qi), len(kj)), dtype=bool)
                if b.causal:
                    assert len(qi) == len(kj), "a causal block must be square"
                    keep = np.tril(keep)
                    # Within a causal block local order must be global order.
                    assert (np.diff(qi) > 0).all() and (qi == kj).all()
                count[np.ix_(qi, kj)] += keep
    want = np.tril(np.ones((T, T), dtype=int)) if causal else np.ones((T, T), dtype=int)
    np.testing.assert_array_equal(count, want)


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_zigzag_balances_causal_work_at_every_step(P) -> None:
    c = 16
    for s in range(P):
        work = [
            sum(b.pairs() for b in step_blocks("zigzag", P, r, (r - s) % P, c, causal=True))
            for r in range(P)
        ]
        # Step 0 is the own causal block (2c^2 + c pairs), later steps 2c^2 full pairs.
        assert work == [2 * c * c + (c if s == 0 else 0)] * P, (s, work)
        # And each step is a single call on every rank.
        assert all(
            len(step_blocks("zigzag", P, r, (r - s) % P, c, causal=True)) == 1 for r in range(P)
        )


@pytest.mark.parametrize("P", [2, 4, 8])
def test_flops_per_rank_zigzag_equal_contiguous_skewed(P) -> None:
    T = 2 * P * 256
    zz = flops_per_rank("zigzag", P, T, causal=True, heads=8, head_dim=64)
    ct = flops_per_rank("contiguous", P, T, causal=True, heads=8, head_dim=64)
    assert max(zz) == min(zz)
    assert sum(zz) == sum(ct) == 4 * 8 * 64 * T * (T + 1) // 2  # all causal pairs, once
    # Contiguous: rank r does (r + 1/2) blocks of (T/P)^2 pairs; max/min -> 2P - 1.
    assert max(ct) / min(ct) == pytest.approx(2 * P - 1, rel=0.01)


def test_layout_errors_are_named() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        chunk_ids("striped", 2, 0)
    with pytest.raises(ValueError, match="rank 2 outside"):
        chunk_ids("zigzag", 2, 2)
    with pytest.raises(ValueError, match="not divisible by 4 chunks"):
        flops_per_rank("zigzag", 2, 10, causal=True)
