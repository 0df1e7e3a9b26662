"""flash_attention equals scaled_dot_product_attention (1e-12, float64), its LSE equals the
reference log-sum-exp, it never allocates Tq x Tk; merge_partials combines exactly."""

from __future__ import annotations

import math
import tracemalloc
import warnings

import numpy as np
import pytest

import attnkit.numpy as an

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "square-97": (1, 2, 2, 97, 97, 8, 8),
    "Tq<Tk": (1, 2, 2, 19, 70, 7, 5),
    "Tq>Tk": (2, 1, 1, 45, 16, 4, 4),
    "Tq=1": (1, 3, 3, 1, 53, 16, 16),
    "Tk=1": (1, 1, 1, 9, 1, 3, 2),
    "GQA": (1, 4, 2, 33, 40, 5, 6),
    "MQA": (1, 3, 1, 21, 21, 1, 2),
}
BANDS = {
    "full": (False, None),
    "causal": (True, None),
    "window(4,2)": (False, (4, 2)),
    "window(None,3)": (False, (None, 3)),
    "window(5,None)": (False, (5, None)),
    "window(0,0)": (False, (0, 0)),
    "causal+window(6,None)": (True, (6, None)),
    "causal+window(3,2)": (True, (3, 2)),
}
BLOCKS = {"16x16": (16, 16), "7x5": (7, 5), "64x128": (64, 128), "1x3": (1, 3)}


def _draw(shape, seed=0):
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((B, H, Tq, Dk)),
        rng.standard_normal((B, Hkv, Tk, Dk)),
        rng.standard_normal((B, Hkv, Tk, Dv)),
    )


@pytest.mark.parametrize("blocks", BLOCKS.values(), ids=BLOCKS.keys())
@pytest.mark.parametrize("band", BANDS.values(), ids=BANDS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_flash_equals_sdpa(unchanged, shape, band, blocks):
    causal, window = band
    q, k, v = _draw(shape)
    with unchanged(q, k, v), warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = an.flash_attention(
            q, k, v, causal=causal, window=window, block_q=blocks[0], block_k=blocks[1],
            return_lse=True,
        )
    want, w = an.scaled_dot_product_attention(q, k, v, causal=causal, window=window)
    assert out.dtype == np.float64 and lse.shape == out.shape[:-1]
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    empty = w.sum(axis=-1) == 0
    assert np.all(lse[empty] == -np.inf) and np.all(out[empty] == 0.0)
    assert np.all(np.isfinite(lse[~empty]))


@pytest.mark.parametrize("band", BANDS.values(), ids=BANDS.keys())
@pytest.mark.parametrize("shape", [SHAPES["GQA"], SHAPES["Tq>Tk"]], ids=["GQA", "Tq>Tk"])
def test_flash_lse_equals_logsumexp_of_masked_scaled_scores(ref, shape, band):
    causal, window = band
    q, k, v = _draw(shape, seed=1)
    out, lse = an.flash_attention(
        q, k, v, causal=causal, window=window, block_q=8, block_k=8, return_lse=True
    )
    want_out, _, want_lse = ref.attention(q, k, v, causal=causal, window=window)
    finite = np.isfinite(want_lse)
    np.testing.assert_array_equal(lse[~finite], -np.inf)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)


def test_flash_lse_of_scores_near_1e4():
    # q . k ~ 1e4 after scaling: the online max trick must keep everything finite.
    rng = np.random.default_rng(2)
    q = 100 * rng.standard_normal((1, 1, 10, 4))
    k = 100 * rng.standard_normal((1, 1, 30, 4))
    v = rng.standard_normal((1, 1, 30, 3))
    out, lse = an.flash_attention(q, k, v, block_q=4, block_k=7, return_lse=True)
    s = np.einsum("bhid,bhjd->bhij", q, k) / 2.0
    m = s.max(axis=-1)
    np.testing.assert_allclose(lse, m + np.log(np.exp(s - m[..., None]).sum(-1)), rtol=1e-14)
    np.testing.assert_allclose(out, an.scaled_dot_product_attention(q, k, v)[0], atol=1e-12)


def test_flash_scale_threads_and_float32():
    q, k, v = _draw((2, 2, 2, 50, 37, 8, 8), seed=3)
    a = an.flash_attention(q, k, v, causal=True, scale=0.3, block_q=16, block_k=8,
                           return_lse=True)
    b = an.flash_attention(q, k, v, causal=True, scale=0.3, block_q=16, block_k=8,
                           num_threads=3, return_lse=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(
        a[0], an.scaled_dot_product_attention(q, k, v, causal=True, scale=0.3)[0], atol=1e-12
    )
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    o32, l32 = an.flash_attention(q32, k32, v32, causal=True, scale=0.3, block_q=16, block_k=8,
                                  return_lse=True)
    assert o32.dtype == np.float32 and l32.dtype == np.float32
    np.testing.assert_allclose(o32, a[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l32, a[1], rtol=1e-5, atol=1e-5)
    # Half precision: statistics in float32, output back in float16, lse float32.
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    o16, l16 = an.flash_attention(q16, k16, v16, causal=True, scale=0.3, block_q=16, block_k=8,
                                  return_lse=True)
    assert o16.dtype == np.float16 and l16.dtype == np.float32
    want16, _ = an.scaled_dot_product_attention(
        *(x.astype(np.float64) for x in (q16, k16, v16)), causal=True, scale=0.3
    )
    np.testing.assert_allclose(o16.astype(np.float64), want16, rtol=2e-3, atol=2e-3)


def test_flash_fully_masked_rows_out_zero_lse_neg_inf():
    q, k, v = _draw((1, 2, 2, 12, 5, 4, 3), seed=4)
    # Tq > Tk causal: the first Tq - Tk queries see no key. window (0, -1) excludes all.
    out, lse = an.flash_attention(q, k, v, causal=True, block_q=4, block_k=2, return_lse=True)
    assert np.all(out[:, :, :7] == 0) and np.all(lse[:, :, :7] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 7:]))
    out, lse = an.flash_attention(q, k, v, window=(0, -1), block_q=4, block_k=2, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_flash_never_allocates_tq_by_tk():
    T, D = 2048, 16
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, T, D)) for _ in range(3))
    tq_tk = T * T * 8  # one float64 score matrix: 32 MiB; q, k, v, out are 256 KiB each
    tracemalloc.start()
    try:
        out = an.flash_attention(q, k, v, causal=True, block_q=128, block_k=128)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < tq_tk / 16, f"peak {peak / 2**20:.2f} MiB, Tq x Tk is {tq_tk / 2**20:.0f} MiB"
    # spot-check the last rows against the reference on a slice of queries
    want, _ = an.scaled_dot_product_attention(q[..., -8:, :], k, v, causal=True)
    np.testing.assert_allclose(out[..., -8:, :], want, atol=1e-12)


def test_flash_returns_out_alone_unless_lse_is_asked_for():
    """The contract of attnkit.triton.flash_attention: ``out``, or ``(out, lse)`` with
    ``return_lse=True``; the same through ``vjp``."""
    q, k, v = _draw(SHAPES["GQA"], seed=7)
    out = an.flash_attention(q, k, v, causal=True, block_q=8, block_k=8)
    both = an.flash_attention(q, k, v, causal=True, block_q=8, block_k=8, return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(both, tuple) and len(both) == 2
    np.testing.assert_array_equal(out, both[0])
    assert both[1].shape == out.shape[:-1]
    via_vjp, pullback = an.vjp(an.flash_attention, q, k, v, causal=True, block_q=8, block_k=8)
    np.testing.assert_array_equal(via_vjp, out)
    assert [g.shape for g in pullback(np.ones_like(out))] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("block", [0, -1])
def test_flash_rejects_bad_blocks(block):
    q, k, v = _draw((1, 1, 1, 4, 4, 2, 2))
    with pytest.raises(ValueError, match=r"block sizes must be positive"):
        an.flash_attention(q, k, v, block_q=block)


# --- merge_partials ----------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 13, 39])
@pytest.mark.parametrize("shape", [SHAPES["GQA"], SHAPES["Tq=1"]], ids=["GQA", "Tq=1"])
def test_chunk_and_merge_equals_whole(unchanged, shape, split):
    q, k, v = _draw(shape, seed=6)
    Tk = k.shape[-2]
    split = min(split, Tk - 1)
    tiles = dict(block_q=8, block_k=8, return_lse=True)
    whole = an.flash_attention(q, k, v, **tiles)
    a = an.flash_attention(q, k[..., :split, :], v[..., :split, :], **tiles)
    b = an.flash_attention(q, k[..., split:, :], v[..., split:, :], **tiles)
    with unchanged(*a, *b):
        out, lse = an.merge_partials(*a, *b)
    np.testing.assert_allclose(out, whole[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, whole[1], rtol=1e-14)


def test_chunk_and_merge_with_causal_keys(ref):
    # The mask travels with the keys: each chunk sees its own columns of the causal mask.
    q, k, v = _draw((1, 2, 2, 11, 11, 3, 3), seed=7)
    keep = ref.band_keep(11, 11, causal=True)
    whole_out, _, whole_lse = ref.attention(q, k, v, mask=keep)
    a_out, _, a_lse = ref.attention(q, k[..., :4, :], v[..., :4, :], mask=keep[:, :4])
    b_out, _, b_lse = ref.attention(q, k[..., 4:, :], v[..., 4:, :], mask=keep[:, 4:])
    assert np.any(b_lse == -np.inf)  # early queries see nothing in the second chunk
    out, lse = an.merge_partials(a_out, a_lse, b_out, b_lse)
    np.testing.assert_allclose(out, whole_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, whole_lse, rtol=1e-14)


@pytest.mark.parametrize("base", [0.0, 1e4, -1e4])
def test_merge_is_stable_for_large_lse(base):
    lse_a = np.array([base, base + 1.0, base - 30.0])
    lse_b = np.array([base, base, base + 5.0])
    out_a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out_b = np.array([[-1.0, 0.0], [1.0, 1.0], [0.5, 0.5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = an.merge_partials(out_a, lse_a, out_b, lse_b)
    d = lse_a - lse_b  # the weights only depend on the difference
    w_a = np.array([1 / (1 + math.exp(-x)) for x in d])
    # lse itself carries an absolute rounding error of eps * |lse|, and the weights
    # exp(lse_a - lse) inherit it: that is the conditioning, not the method.
    tol = 4 * np.finfo(np.float64).eps * max(1.0, abs(base))
    want = w_a[:, None] * out_a + (1 - w_a)[:, None] * out_b
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
    want_lse = [max(a, b) + math.log1p(math.exp(-abs(a - b))) for a, b in zip(lse_a, lse_b)]
    np.testing.assert_allclose(lse, want_lse, rtol=1e-15, atol=1e-12)


def test_merge_with_empty_sides():
    out_a = np.array([[1.0, 2.0], [np.nan, np.inf], [np.nan, np.nan]])
    lse_a = np.array([0.5, -np.inf, -np.inf])
    out_b = np.array([[np.nan, 7.0], [3.0, 4.0], [np.inf, -np.inf]])
    lse_b = np.array([-np.inf, 2.0, -np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = an.merge_partials(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(out, [[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(lse, [0.5, 2.0, -np.inf])


def test_merge_rejects_mismatched_partials():
    with pytest.raises(ValueError, match=r"out_a \(2, 3\), lse_a \(2,\), out_b \(2, 4\)"):
        an.merge_partials(np.zeros((2, 3)), np.zeros(2), np.zeros((2, 4)), np.zeros(2))
