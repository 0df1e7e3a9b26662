"""flash_attention skips a key block's max when every row has a reference score already
(an earlier block's max); a block whose scores rise far above it is redone with its own.
Both ways must give the reference's answer."""

from __future__ import annotations

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.numpy import flash


def _qkv(T: int = 48, D: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((2, 3, T, D)) for _ in range(3))


def _count_redone(monkeypatch) -> list[int]:
    """Count the tiles whose scores are formed: one per block, two when redone."""
    calls = [0]
    real = flash._tile_scores

    def spy(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(flash, "_tile_scores", spy)
    return calls


def test_later_blocks_reuse_the_reference_and_match(monkeypatch):
    q, k, v = _qkv()
    calls = _count_redone(monkeypatch)
    out, lse = an.flash_attention(q, k, v, block_q=16, block_k=8, num_threads=1,
                                  return_lse=True)
    ref, _ = an.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert calls[0] == 3 * 6  # 3 query blocks x 6 key blocks, none redone
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)


@pytest.mark.parametrize("jump", [30.0, 200.0])  # past the sum limit; past exp's range
def test_a_score_far_above_the_reference_redoes_its_block(monkeypatch, jump):
    q, k, v = _qkv()
    k[:, :, 40] = q[:, :, 5] * jump  # key 40 (block 5) scores far above row 5's earlier keys
    calls = _count_redone(monkeypatch)
    out, lse = an.flash_attention(q, k, v, block_q=16, block_k=8, num_threads=1,
                                  return_lse=True)
    ref, _ = an.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert calls[0] > 3 * 6  # the jump's block was redone
    assert np.isfinite(lse).all()


def test_nan_in_a_later_block_propagates_as_before():
    q, k, v = _qkv()
    k[0, 1, 30, 2] = np.nan
    out = an.flash_attention(q, k, v, block_q=16, block_k=8, num_threads=1)
    ref, _ = an.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out[~np.isnan(out)], ref[~np.isnan(ref)], rtol=1e-12)


def test_float32_at_large_logits_stays_as_exact():
    """Scores near 1e4: s - m is formed from two scores, as without the skipped max."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 64, 16)).astype(np.float32)
    k = (q[:, :, ::-1] * 25).astype(np.float32)  # scores of order 1e3-1e4
    v = rng.standard_normal((1, 2, 64, 16)).astype(np.float32)
    out = an.flash_attention(q, k, v, block_q=16, block_k=16, num_threads=1)
    ref, _ = an.scaled_dot_product_attention(q.astype(np.float64), k.astype(np.float64),
                                             v.astype(np.float64))
    plain, _ = an.scaled_dot_product_attention(q, k, v)  # float32, every max exact
    err, err_plain = np.abs(out - ref).max(), np.abs(plain - ref).max()
    assert err <= 2 * err_plain + 1e-5, (err, err_plain)
