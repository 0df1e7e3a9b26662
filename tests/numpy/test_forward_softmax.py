"""softmax, log_softmax, logsumexp against a plain float64 formula, row by row."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attnkit.numpy as an

# Output tolerance per dtype: half precision rounds to ~5e-4 relative.
TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}
DTYPES = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("magnitude", [1.0, 30.0])
def test_softmax_family_any_axis_and_dtype(ref, unchanged, dtype, axis, magnitude):
    rng = np.random.default_rng(1)
    x = (magnitude * rng.standard_normal((3, 4, 5))).astype(dtype)
    x64 = x.astype(np.float64)  # the reference sees exactly the rounded input
    with unchanged(x):
        s = an.softmax(x, axis=axis)
        ls = an.log_softmax(x, axis=axis)
        lse = an.logsumexp(x, axis=axis)
        lse_k = an.logsumexp(x, axis=axis, keepdims=True)
    for y in (s, ls, lse, lse_k):
        assert y.dtype == dtype
    want_s = ref.softmax(x64, axis)
    want_lse = ref.logsumexp(x64, axis)
    tol = TOL[dtype]
    np.testing.assert_allclose(s.astype(np.float64), want_s, rtol=tol, atol=tol)
    # log-domain values are O(magnitude): compare relative to the row's scale
    scale = max(1.0, magnitude)
    np.testing.assert_allclose(lse.astype(np.float64), want_lse, rtol=tol, atol=tol * scale)
    np.testing.assert_array_equal(lse_k, np.expand_dims(lse, axis))
    want_ls = x64 - np.expand_dims(want_lse, axis)
    np.testing.assert_allclose(ls.astype(np.float64), want_ls, rtol=tol, atol=tol * scale * 4)
    np.testing.assert_allclose(s.astype(np.float64).sum(axis=axis), 1.0, atol=tol * 5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_logits_of_1e4_stay_finite(ref, dtype, sign):
    x = (sign * 1e4 + np.array([[0.0, -1.0, -2.0, 3.5], [1e4, -1e4, 0.5, 2.0]])).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid-value warnings either
        s, ls, lse = an.softmax(x), an.log_softmax(x), an.logsumexp(x)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(lse))
    assert np.all(np.isfinite(ls) | (ls == -np.inf))
    x64 = x.astype(np.float64)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(s, ref.softmax(x64, -1), rtol=tol, atol=tol)
    # lse ~ 1e4: float32 holds it to ~1e-3 absolute
    np.testing.assert_allclose(lse, ref.logsumexp(x64, -1), rtol=tol)


def test_logsumexp_of_two_equal_huge_logits_is_exact():
    x = np.array([1e4, 1e4])
    assert an.logsumexp(x) == pytest.approx(1e4 + np.log(2.0), rel=1e-15)
    np.testing.assert_allclose(an.softmax(x), [0.5, 0.5], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, -1])
def test_all_neg_inf_row_gives_zeros_and_neg_inf(unchanged, dtype, axis):
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, -np.inf]], dtype=dtype)
    x = x if axis == -1 else x.T.copy()
    with unchanged(x), warnings.catch_warnings():
        warnings.simplefilter("error")
        s = an.softmax(x, axis=axis)
        lse = an.logsumexp(x, axis=axis)
        ls = an.log_softmax(x, axis=axis)
    s, ls = (np.moveaxis(a, axis, -1) for a in (s, ls))
    np.testing.assert_array_equal(s[0], 0.0)
    assert lse[0] == -np.inf and lse.dtype == dtype
    assert np.all(ls[0] == -np.inf)
    e = np.exp([0.0, 1.0])
    np.testing.assert_allclose(s[1], [e[0] / e.sum(), e[1] / e.sum(), 0.0], rtol=TOL[dtype])
    assert ls[1, 2] == -np.inf and np.all(np.isfinite(ls[1, :2]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates_to_its_own_row_only(ref, dtype):
    x = np.array([[0.5, np.nan, 1.0], [0.5, 2.0, 1.0]], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s, lse, ls = an.softmax(x), an.logsumexp(x), an.log_softmax(x)
    assert np.all(np.isnan(s[0])) and np.isnan(lse[0]) and np.all(np.isnan(ls[0]))
    np.testing.assert_allclose(s[1], ref.softmax(x[1:].astype(np.float64), -1)[0], rtol=TOL[dtype])
    assert np.isfinite(lse[1]) and np.all(np.isfinite(ls[1]))


def test_softmax_of_single_entry_and_empty_axis():
    np.testing.assert_array_equal(an.softmax(np.array([[3.0], [-np.inf]])), [[1.0], [0.0]])
    assert an.logsumexp(np.zeros((2, 0))).tolist() == [-np.inf, -np.inf]
