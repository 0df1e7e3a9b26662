"""flash_attention picks its tiles and threads itself; a caller can still pick them."""

from __future__ import annotations

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.numpy import _plan


def test_defaults_are_big_tiles_clipped_to_the_lengths_and_one_worker_per_core(monkeypatch):
    monkeypatch.setattr(_plan, "usable_cores", lambda: 2)
    long = _plan.plan(4096, 4096, None, None, None)
    assert (long.block_q, long.block_k, long.threads) == (256, 512, 2)
    assert long.limit_blas
    # 1024 queries give two workers two blocks of 256 each; 1000 do not: the smaller tile.
    assert (_plan.plan(1024, 1024, None, None, None).block_q) == 256
    mid = _plan.plan(1000, 1000, None, None, None)
    assert (mid.block_q, mid.block_k, mid.threads) == (128, 256, 2)
    # More workers need more queries before the large tile pays.
    monkeypatch.setattr(_plan, "usable_cores", lambda: 8)
    assert _plan.plan(2048, 2048, None, None, None).block_q == 128
    assert _plan.plan(4096, 4096, None, None, None).block_q == 256
    # A caller's thread count decides it the same way.
    assert _plan.plan(1024, 1024, None, None, 1).block_q == 256
    assert _plan.plan(256, 256, None, None, 1).block_q == 128
    short = _plan.plan(5, 7, None, None, None)  # one tile, so one worker
    assert (short.block_q, short.block_k, short.threads) == (5, 7, 1)
    assert not short.limit_blas


def test_given_sizes_are_kept():
    p = _plan.plan(4096, 4096, 32, 16, 3)
    assert (p.block_q, p.block_k, p.threads) == (32, 16, 3)


def test_without_threadpoolctl_the_default_stays_single_threaded(monkeypatch):
    monkeypatch.setattr(_plan, "_can_limit_blas", lambda: False)
    monkeypatch.setattr(_plan, "usable_cores", lambda: 8)
    assert _plan.plan(4096, 4096, None, None, None).threads == 1


@pytest.mark.parametrize("name", ["block_q", "block_k", "num_threads"])
@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_sizes_name_the_argument(name, bad):
    q = np.zeros((1, 2, 4, 3))
    with pytest.raises(ValueError, match=name):
        an.flash_attention(q, q, q, **{name: bad})


def test_blas_runs_single_threaded_inside_the_workers_only(monkeypatch):
    """The pool's workers must not each start BLAS threads; the caller's BLAS setting is
    back after the call."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = []
    real = _plan.blas_threads_limited

    def spy(active):
        seen.append(active)
        return real(active)

    monkeypatch.setattr(_plan, "blas_threads_limited", spy)
    monkeypatch.setattr(_plan, "usable_cores", lambda: 2)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 300, 16)) for _ in range(3))
    before = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
    out = an.flash_attention(q, k, v)
    assert seen == [True]
    assert [p["num_threads"] for p in threadpoolctl.threadpool_info()] == before
    ref, _ = an.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
