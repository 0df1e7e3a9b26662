"""sequence_mask, causal/window masks and masked_softmax (d2l semantics) by definition."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attnkit.numpy as an


@pytest.mark.parametrize("maxlen", [0, 1, 6])
def test_sequence_mask_1d(unchanged, maxlen):
    lens = np.array([0, maxlen, maxlen // 2])
    with unchanged(lens):
        m = an.sequence_mask(lens, maxlen)
    assert m.dtype == np.bool_ and m.shape == (3, maxlen)
    for b in range(3):
        for j in range(maxlen):
            assert m[b, j] == (j < lens[b])


def test_sequence_mask_2d_per_query_lengths(unchanged):
    lens = np.array([[1, 4, 0], [2, 2, 5]])
    with unchanged(lens):
        m = an.sequence_mask(lens, 5)
    assert m.shape == (2, 3, 5)
    for b, i, j in np.ndindex(2, 3, 5):
        assert m[b, i, j] == (j < lens[b, i])


def test_sequence_mask_accepts_whole_floats_but_not_fractions():
    np.testing.assert_array_equal(an.sequence_mask(np.array([2.0]), 3), [[True, True, False]])
    with pytest.raises(TypeError, match=r"whole numbers"):
        an.sequence_mask(np.array([1.5]), 3)


@pytest.mark.parametrize("Tq,Tk", [(1, 1), (1, 6), (6, 1), (4, 7), (7, 4), (5, 5)])
def test_causal_and_window_masks_by_definition(ref, Tq, Tk):
    np.testing.assert_array_equal(an.causal_mask(Tq, Tk), ref.band_keep(Tq, Tk, causal=True))
    for left, right in [(0, 0), (2, 1), (None, 0), (1, None), (None, None), (3, -1)]:
        np.testing.assert_array_equal(
            an.window_mask(Tq, Tk, left, right),
            ref.band_keep(Tq, Tk, window=(left, right)),
            err_msg=f"window=({left}, {right})",
        )


def test_causal_mask_draws_bottom_right_alignment():
    # DESIGN.md: query i sees key j iff j <= i + Tk - Tq (1 = keep)
    np.testing.assert_array_equal(an.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(an.causal_mask(3, 2), [[0, 0], [1, 0], [1, 1]])


def _masked_softmax_ref(ref, scores, keep):
    out = np.zeros(scores.shape)
    for idx in np.ndindex(*scores.shape[:-1]):
        out[idx], _ = ref.softmax_row(scores[idx], keep[idx])
    return out


@pytest.mark.parametrize("shape", [(3, 4, 6), (3, 2, 4, 6), (2, 1, 1), (2, 5, 1)])
@pytest.mark.parametrize("kind", ["1d", "2d", "mask", "1d+mask"])
def test_masked_softmax_d2l_semantics(ref, unchanged, shape, kind):
    rng = np.random.default_rng(3)
    B, Tq, Tk = shape[0], shape[-2], shape[-1]
    scores = rng.standard_normal(shape)
    vl = mask = None
    keep = np.ones(shape, dtype=bool)
    if kind.startswith("1d"):
        vl = rng.integers(0, Tk + 1, size=B)
        vl[0] = 0  # one batch row fully masked
        keep &= ref.lengths_keep(vl, shape[:-2], Tq, Tk)
    if kind == "2d":
        vl = rng.integers(0, Tk + 1, size=(B, Tq))
        vl[-1, 0] = 0
        keep &= ref.lengths_keep(vl, shape[:-2], Tq, Tk)
    if "mask" in kind:
        mask = rng.random((Tq, Tk)) < 0.6
        keep &= mask
    with unchanged(scores, vl, mask):
        w = an.masked_softmax(scores, vl, mask=mask)
    assert w.dtype == scores.dtype and w.shape == shape
    np.testing.assert_allclose(w, _masked_softmax_ref(ref, scores, keep), rtol=1e-12, atol=1e-15)
    assert np.all(w[~keep] == 0.0), "masked entries must be exactly 0"
    rows = keep.any(axis=-1)
    np.testing.assert_allclose(w.sum(axis=-1)[rows], 1.0, rtol=1e-12)
    assert np.all(w.sum(axis=-1)[~rows] == 0.0), "fully masked rows must be all 0"


def test_masked_softmax_1d_lengths_apply_to_every_query_and_head(ref):
    scores = np.zeros((2, 3, 4, 5))  # (B, H, Tq, Tk)
    w = an.masked_softmax(scores, np.array([2, 5]))
    np.testing.assert_allclose(w[0, :, :, :2], 0.5)
    np.testing.assert_array_equal(w[0, :, :, 2:], 0.0)
    np.testing.assert_allclose(w[1], 0.2)


def test_masked_softmax_2d_lengths_per_query(ref):
    scores = np.zeros((1, 3, 4))
    w = an.masked_softmax(scores, np.array([[1, 2, 4]]))
    np.testing.assert_allclose(w[0], [[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.25] * 4])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_masked_softmax_nan_or_inf_in_masked_position_does_not_leak(unchanged, dtype):
    rng = np.random.default_rng(4)
    scores = rng.standard_normal((2, 3, 5)).astype(dtype)
    vl = np.array([3, 1])
    dirty = scores.copy()
    dirty[0, :, 3:] = np.nan
    dirty[1, 0, 1:] = np.inf
    dirty[1, 1, 4] = -np.inf
    with unchanged(dirty), warnings.catch_warnings():
        warnings.simplefilter("error")
        w_dirty = an.masked_softmax(dirty, vl)
    w_clean = an.masked_softmax(scores, vl)
    assert w_dirty.dtype == dtype
    np.testing.assert_array_equal(w_dirty, w_clean)
    assert not np.any(np.isnan(w_dirty))


def test_masked_softmax_nan_in_attended_position_propagates():
    scores = np.array([[[0.0, np.nan, 1.0], [0.0, 1.0, 2.0]]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        w = an.masked_softmax(scores, np.array([[3, 1]]))
    assert np.all(np.isnan(w[0, 0]))
    np.testing.assert_array_equal(w[0, 1], [1.0, 0.0, 0.0])


def test_masked_softmax_with_mask_along_another_axis(ref):
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((4, 3))
    mask = rng.random((4, 3)) < 0.5
    mask[:, 1] = False  # column 1 fully masked along axis 0
    w = an.masked_softmax(scores, mask=mask, axis=0)
    want = _masked_softmax_ref(ref, scores.T, mask.T).T
    np.testing.assert_allclose(w, want, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(w[:, 1], 0.0)
