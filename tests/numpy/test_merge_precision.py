"""Merging partials by LSE keeps its normalisation at any magnitude (issue 16).

The merge normalises by the sum of the two weights (``attnkit.spec.merge_by_lse``), so it
never rounds at the magnitude of the LSE: identical partials come back unchanged and the
weights depend on the LSE difference alone. The torch twin
(``attnkit.distributed.merge_partials``) shares the rule and is held to the same tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnkit.numpy as an

torch = pytest.importorskip("torch")
from attnkit.distributed import merge_partials as torch_merge  # noqa: E402


def _numpy_merge(*parts):
    return an.merge_partials(*parts)


def _torch_merge(*parts):
    out, lse = torch_merge(*(torch.from_numpy(np.asarray(x)) for x in parts))
    return out.numpy(), lse.numpy()


MERGES = pytest.mark.parametrize("merge", [_numpy_merge, _torch_merge], ids=["numpy", "torch"])

# Before: float32 relative error 2e-4 at LSE 1e4, 0.26 at 1e7, output doubled at 1e8;
# float64 doubled at 1e16.
MAGNITUDES = [(np.float32, x) for x in (0.0, 1e4, -1e4, 1e7, 1e8, 3e38)] + [
    (np.float64, x) for x in (0.0, 1e4, 1e16, -1e16, 1e300)
] + [(np.float16, x) for x in (0.0, 1e4, 6e4)]


@MERGES
@pytest.mark.parametrize("dtype, base", MAGNITUDES, ids=lambda x: str(x))
def test_merging_identical_partials_returns_them_unchanged(merge, dtype, base):
    out = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(dtype)
    lse = np.full((3, 5), base, dtype=dtype)
    got, got_lse = merge(out, lse, out, lse)
    np.testing.assert_array_equal(got, out)  # exactly: (x + x) / 2 == x
    assert got.dtype == out.dtype and got_lse.dtype == lse.dtype
    want_lse = np.asarray(base + math.log(2.0), dtype=dtype)  # correctly rounded
    assert np.all(np.abs(got_lse.astype(np.float64) - float(want_lse)) <= float(
        np.spacing(np.abs(want_lse))))


@MERGES
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("base", [0.0, 1e4, 1e6, -1e6])
def test_merge_weights_depend_on_the_lse_difference_only(merge, dtype, base):
    # LSE values base + d with d exactly representable at base: the result must be the
    # one at base 0, to the dtype's rounding of the O(1) weights, whatever base is.
    rng = np.random.default_rng(1)
    d_a = np.array([0.0, 1.0, -3.0, 20.0, -0.5], dtype=dtype)
    d_b = np.array([0.0, -2.0, 0.5, 0.0, -0.5], dtype=dtype)
    out_a = rng.standard_normal((5, 4)).astype(dtype)
    out_b = rng.standard_normal((5, 4)).astype(dtype)
    got, lse = merge(out_a, (base + d_a).astype(dtype), out_b, (base + d_b).astype(dtype))
    w = 1.0 / (1.0 + np.exp(d_b.astype(np.float64) - d_a))
    want = w[:, None] * out_a + (1 - w[:, None]) * out_b
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * eps)
    want_lse = base + np.logaddexp(d_a.astype(np.float64), d_b)
    np.testing.assert_allclose(lse, want_lse, rtol=2 * eps, atol=2 * eps)


@MERGES
def test_chunks_at_logits_near_1e4_merge_to_the_whole_float32(merge):
    # Scores 1e4 + O(1), exact in float32 (dyadic inputs, scale 1/8): merging the chunks'
    # float32 outputs by their float64 LSEs is as good as the whole computed at once.
    rng = np.random.default_rng(2)
    q = np.round(rng.uniform(-2, 2, (2, 6, 64)) * 8) / 8
    k = np.round(rng.uniform(-2, 2, (2, 40, 64)) * 8) / 8
    q[..., 0], k[..., 0] = 256.0, 312.5
    v = rng.standard_normal((2, 40, 16))
    ref_out, _ = an.scaled_dot_product_attention(q, k, v)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    whole = an.flash_attention(*f32)
    parts = [an.flash_attention(f32[0], f32[1][:, cut], f32[2][:, cut], return_lse=True,
                                lse_dtype=np.float64)
             for cut in (slice(None, 17), slice(17, None))]
    out, _ = merge(*parts[0], *parts[1])
    assert out.dtype == np.float32
    whole_err = np.max(np.abs(whole - ref_out))
    # float32 rounding of O(1) outputs, not of the 1e4 LSE (2e-4 before).
    assert np.max(np.abs(out - ref_out)) <= 2 * whole_err + 1e-6 < 2e-6
    # A float32 LSE is itself rounded to 5e-4 at 1e4: merges of such partials are only
    # that good (why ring attention carries its LSE in float64).
    rounded = [(o, lse.astype(np.float32)) for o, lse in parts]
    out32, _ = merge(*rounded[0], *rounded[1])
    assert np.max(np.abs(out32 - ref_out)) > 10 * whole_err
