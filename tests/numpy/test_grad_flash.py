"""flash_attention's blockwise backward: equal to the dense backward, linear in memory,
and it skips the key blocks the forward skips."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attnkit.numpy import _plan, flash_attention, scaled_dot_product_attention, vjp
from attnkit.numpy.flash import flash_attention_backward

# (q shape, k shape, v shape): odd lengths off block multiples, Tq != Tk both ways, GQA,
# MQA, Dk != Dv, broadcast batch dims, no head axis.
SHAPES = {
    "odd": ((2, 3, 37, 7), (2, 3, 37, 7), (2, 3, 37, 7)),
    "Tq<Tk": ((1, 2, 13, 5), (1, 2, 50, 5), (1, 2, 50, 9)),
    "Tq>Tk": ((1, 2, 50, 5), (1, 2, 13, 5), (1, 2, 13, 3)),
    "Tq=1": ((2, 2, 1, 8), (2, 2, 33, 8), (2, 2, 33, 8)),
    "gqa": ((2, 6, 21, 4), (2, 2, 29, 4), (2, 2, 29, 6)),
    "mqa": ((1, 4, 19, 3), (1, 1, 19, 3), (1, 1, 19, 3)),
    "broadcast-batch": ((3, 2, 11, 4), (1, 2, 17, 4), (1, 2, 17, 4)),
    "no-heads": ((23, 6), (31, 6), (31, 2)),
}
BANDS = {
    "full": {},
    "causal": {"causal": True},
    "window": {"window": (5, 2)},
    "causal+window": {"causal": True, "window": (4, None)},
    "narrow": {"window": (0, 0)},
}


@pytest.mark.parametrize("blocks", [(8, 8), (5, 16), (64, 3)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("band", list(BANDS.values()), ids=list(BANDS))
@pytest.mark.parametrize("shapes", list(SHAPES.values()), ids=list(SHAPES))
def test_flash_backward_equals_dense_backward(shapes, band, blocks) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    (out, _), dense = vjp(scaled_dot_product_attention, q, k, v, **band)
    (f_out, lse), blockwise = vjp(
        flash_attention, q, k, v, block_q=blocks[0], block_k=blocks[1], return_lse=True, **band
    )
    g = rng.standard_normal(out.shape)
    for name, a, b in zip("qkv", blockwise(g), dense(g)):
        assert a.shape == b.shape
        err = np.max(np.abs(a - b), initial=0.0)
        assert err <= 1e-10, f"d{name}: flash vs dense max error {err:.3e}"
        assert np.all(np.isfinite(a))
    empty = np.isneginf(lse)  # rows with no allowed key (Tq > Tk causal, narrow windows)
    dq = blockwise(g)[0]
    assert np.all(dq[np.broadcast_to(empty, dq.shape[:-1])] == 0.0)


def test_flash_backward_float32_stays_close_to_float64() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 2, 40, 8)) for _ in range(3))
    g = rng.standard_normal((2, 2, 40, 8))
    ref = vjp(flash_attention, q, k, v, causal=True)[1](g)
    low = vjp(flash_attention, *(x.astype(np.float32) for x in (q, k, v)), causal=True)[1](
        g.astype(np.float32)
    )
    for a, b in zip(low, ref):
        assert a.dtype == np.float32
        assert np.max(np.abs(a - b)) < 1e-4


def _count_tiles(monkeypatch, **band) -> int:
    """How many (query block, key block) tiles the backward visits."""
    calls = []
    real = _plan._band

    def counting(*args):
        calls.append(args[:4])
        return real(*args)

    T, block = 64, 8
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, T, 4)) for _ in range(3))
    out, lse = flash_attention(q, k, v, block_q=block, block_k=block, return_lse=True, **band)
    monkeypatch.setattr(_plan, "_band", counting)
    flash_attention_backward(
        np.ones_like(out), q, k, v, out, lse, block_q=block, block_k=block, **band
    )
    return len(calls)


def test_flash_backward_skips_blocks_outside_the_band(monkeypatch) -> None:
    n = 64 // 8
    assert _count_tiles(monkeypatch) == n * n
    assert _count_tiles(monkeypatch, causal=True) == n * (n + 1) // 2
    # a diagonal-only window touches the diagonal tiles (and no more than one neighbour each)
    assert _count_tiles(monkeypatch, window=(0, 0)) == n


def test_flash_backward_memory_is_linear_in_length() -> None:
    T, D = 4096, 8
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, T, D)) for _ in range(3))
    out, lse = flash_attention(q, k, v, causal=True, block_q=128, block_k=128, return_lse=True)
    g = rng.standard_normal(out.shape)
    tracemalloc.start()
    try:
        dq, dk, dv = flash_attention_backward(
            g, q, k, v, out, lse, causal=True, block_q=128, block_k=128
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    dense_scores = T * T * 8  # one float64 Tq x Tk matrix: 128 MiB
    # input-sized buffers (0.25 MiB each) plus a few 128 x 128 tiles (0.125 MiB each)
    assert peak < dense_scores / 32, f"peak {peak / 2**20:.2f} MiB"
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.2f} MiB"
    # and it still is the right gradient: spot-check the last query rows against dense
    tail = slice(T - 64, T)
    _, dense = vjp(
        scaled_dot_product_attention, q[..., tail, :], k, v, causal=True
    )
    d_dense = dense(g[..., tail, :])
    assert np.max(np.abs(dq[..., tail, :] - d_dense[0])) < 1e-10
