"""scaled_dot_product_attention against the float64 loop reference, over shapes and masks
that break code, plus dropout, NaN handling and the no-copy GQA guarantee."""

from __future__ import annotations

import tracemalloc
import warnings
import zlib

import numpy as np
import pytest

import attnkit.numpy as an

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "Tq=1": (2, 2, 2, 1, 5, 7, 7),
    "Tk=1": (2, 2, 2, 5, 1, 7, 3),
    "Tq>Tk": (1, 3, 3, 9, 4, 8, 8),
    "Tq<Tk": (1, 3, 3, 4, 9, 8, 8),
    "D=1": (2, 2, 2, 6, 6, 1, 1),
    "Dk=59,Dv=7": (1, 2, 2, 13, 17, 59, 7),
    "GQA": (2, 4, 2, 7, 11, 7, 5),
    "MQA": (1, 4, 1, 5, 13, 8, 1),
    "square": (1, 2, 2, 23, 23, 16, 16),
}

# Each case lists the constraints to pass; "*" marks randomly drawn arrays.
MASK_CASES = {
    "none": {},
    "mask": {"mask": "*"},
    "mask-per-head": {"mask": "*head"},
    "bias": {"bias": "*"},
    "bias-with-inf": {"bias": "*inf"},
    "valid_lens-1d": {"valid_lens": "*1d"},
    "valid_lens-2d": {"valid_lens": "*2d"},
    "causal": {"causal": True},
    "window(2,1)": {"window": (2, 1)},
    "window(None,1)": {"window": (None, 1)},
    "window(1,None)": {"window": (1, None)},
    "window(None,None)": {"window": (None, None)},
    "window(0,0)": {"window": (0, 0)},
    "causal+window(3,None)": {"causal": True, "window": (3, None)},
    "mask+valid_lens-1d+causal": {"mask": "*", "valid_lens": "*1d", "causal": True},
    "all": {"mask": "*head", "bias": "*inf", "valid_lens": "*2d", "window": (2, 2)},
    "all+causal": {"mask": "*", "bias": "*", "valid_lens": "*1d", "causal": True,
                   "window": (None, 1)},
}


def draw(rng, shape, case):
    """Arrays q, k, v and the keyword arguments of one mask case."""
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    q = rng.standard_normal((B, H, Tq, Dk))
    k = rng.standard_normal((B, Hkv, Tk, Dk))
    v = rng.standard_normal((B, Hkv, Tk, Dv))
    kw = {}
    for name, spec in case.items():
        if spec == "*":  # one mask for every head: (B, 1, Tq, Tk)
            kw[name] = (
                rng.random((B, 1, Tq, Tk)) < 0.7 if name == "mask"
                else rng.standard_normal((B, 1, Tq, Tk))
            )
        elif spec == "*head":
            kw[name] = rng.random((H, Tq, Tk)) < 0.7
        elif spec == "*inf":
            bias = rng.standard_normal((B, H, Tq, Tk))
            bias[rng.random(bias.shape) < 0.2] = -np.inf
            bias[0, 0, 0] = -np.inf  # one fully excluded row
            kw[name] = bias
        elif spec == "*1d":
            vl = rng.integers(0, Tk + 1, size=B)
            vl[0] = min(1, Tk) if B == 1 else 0
            kw[name] = vl
        elif spec == "*2d":
            vl = rng.integers(0, Tk + 1, size=(B, Tq))
            vl[0, -1] = 0
            kw[name] = vl
        else:
            kw[name] = spec
    return q, k, v, kw


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("case", MASK_CASES.values(), ids=MASK_CASES.keys())
def test_sdpa_matches_loop_reference(ref, unchanged, shape, case):
    rng = np.random.default_rng(zlib.crc32(repr((shape, case)).encode()))
    q, k, v, kw = draw(rng, shape, case)
    arrays = [q, k, v] + [a for a in kw.values() if isinstance(a, np.ndarray)]
    with unchanged(*arrays), warnings.catch_warnings():
        warnings.simplefilter("error")  # a fully masked row must not even warn
        out, w = an.scaled_dot_product_attention(q, k, v, **kw)
    want_out, want_w, _ = ref.attention(q, k, v, **kw)
    assert out.dtype == np.float64 and w.dtype == np.float64
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)
    # Fully masked rows (they occur for Tq > Tk causal, valid_lens 0, -inf bias rows)
    empty = want_w.sum(axis=-1) == 0
    assert np.all(w[empty] == 0.0) and np.all(out[empty] == 0.0)
    assert not np.any(np.isnan(out))


@pytest.mark.parametrize(
    "shape_id,case_id",
    [("Tq>Tk", "causal"), ("GQA", "valid_lens-1d"), ("square", "bias-with-inf"),
     ("Tq=1", "valid_lens-2d")],
)
def test_parametrization_really_has_fully_masked_rows(ref, shape_id, case_id):
    # Guard for the test above: its empty-row assertions must not be vacuous.
    shape, case = SHAPES[shape_id], MASK_CASES[case_id]
    rng = np.random.default_rng(zlib.crc32(repr((shape, case)).encode()))
    q, k, v, kw = draw(rng, shape, case)
    _, want_w, _ = ref.attention(q, k, v, **kw)
    assert np.any(want_w.sum(axis=-1) == 0)


@pytest.mark.parametrize(
    "q_shape,kv_shape",
    [((5, 3), (7, 3)), ((2, 3, 2, 4, 3), (2, 3, 2, 6, 3)), ((2, 3, 4, 4, 3), (2, 3, 2, 6, 3))],
    ids=["no-batch", "5-D", "5-D-GQA"],
)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_any_leading_dims(ref, unchanged, q_shape, kv_shape, causal):
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal(q_shape), rng.standard_normal(kv_shape), rng.standard_normal(
        kv_shape[:-1] + (2,)
    )
    with unchanged(q, k, v):
        out, w = an.scaled_dot_product_attention(q, k, v, causal=causal)
    want_out, want_w, _ = ref.attention(q, k, v, causal=causal)
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)


def test_sdpa_without_head_axis_d2l_layout(ref):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((3, t, 4)) for t in (2, 6, 6))
    vl = np.array([[1, 6], [0, 3], [6, 2]])
    out, w = an.scaled_dot_product_attention(q, k, v, valid_lens=vl)
    want_out, want_w, _ = ref.attention(q, k, v, valid_lens=vl)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(out[1, 0], 0.0)


@pytest.mark.parametrize("scale", [0.1, 2.0])
def test_sdpa_explicit_scale(ref, scale):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))
    out, _ = an.scaled_dot_product_attention(q, k, v, scale=scale)
    np.testing.assert_allclose(out, ref.attention(q, k, v, scale=scale)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float16, 3e-3)])
def test_sdpa_low_precision_keeps_its_dtype(ref, unchanged, dtype, tol):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 2, 9, 8)).astype(dtype) for _ in range(3))
    with unchanged(q, k, v):
        out, w = an.scaled_dot_product_attention(q, k, v, causal=True)
    assert out.dtype == dtype and w.dtype == dtype
    want_out, want_w, _ = ref.attention(q, k, v, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), want_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(w.astype(np.float64), want_w, rtol=tol, atol=tol)


def test_bias_of_1e4_scale_stays_finite(ref):
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((1, 1, 4, 3)) for _ in range(3))
    bias = 1e4 * rng.standard_normal((4, 4))
    out, w = an.scaled_dot_product_attention(q, k, v, bias=bias)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref.attention(q, k, v, bias=bias)[0], rtol=1e-10, atol=1e-12)


# --- GQA --------------------------------------------------------------------------------


@pytest.mark.parametrize("Hkv", [1, 2, 3])
def test_gqa_equals_attention_with_repeated_heads(Hkv):
    rng = np.random.default_rng(11)
    H = 6
    q = rng.standard_normal((2, H, 5, 4))
    k, v = rng.standard_normal((2, Hkv, 7, 4)), rng.standard_normal((2, Hkv, 7, 3))
    out, w = an.scaled_dot_product_attention(q, k, v, causal=True)
    # Head h reads kv head h // G: np.repeat along the head axis is exactly that layout.
    G = H // Hkv
    out_r, w_r = an.scaled_dot_product_attention(
        q, np.repeat(k, G, axis=1), np.repeat(v, G, axis=1), causal=True
    )
    np.testing.assert_allclose(out, out_r, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(w, w_r, rtol=1e-13, atol=1e-15)


def test_gqa_does_not_copy_kv_per_query_head():
    # Decoding shape: one query, a long K/V shared by 16 query heads (MQA).
    H, Tk, D = 16, 16384, 32
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, H, 1, D))
    k = rng.standard_normal((1, 1, Tk, D))
    v = rng.standard_normal((1, 1, Tk, D))
    copies = H * (k.nbytes + v.nbytes)  # what repeating K and V H times would allocate
    tracemalloc.start()
    try:
        out, w = an.scaled_dot_product_attention(q, k, v)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == (1, H, 1, D)
    # Allowed: the scores/weights (H * Tk floats, a few times) and one K/V-sized temporary.
    assert peak < copies / 4, f"peak {peak / 2**20:.1f} MiB vs H copies {copies / 2**20:.1f} MiB"


# --- dropout ----------------------------------------------------------------------------


def _qkv(seed=13, shape=(2, 2, 4, 3)):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) for _ in range(3))


def test_dropout_zero_equals_no_dropout():
    q, k, v = _qkv()
    a = an.scaled_dot_product_attention(q, k, v, causal=True)
    b = an.scaled_dot_product_attention(
        q, k, v, causal=True, dropout_p=0.0, rng=np.random.default_rng(1)
    )
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_dropout_reproducible_with_rng_and_weights_pre_dropout(unchanged):
    q, k, v = _qkv()
    plain_out, plain_w = an.scaled_dot_product_attention(q, k, v)

    def dropped(seed):
        rng = np.random.default_rng(seed)
        return an.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=rng)

    with unchanged(q, k, v):
        o1, w1 = dropped(3)
    o2, w2 = dropped(3)
    o3, _ = dropped(4)
    np.testing.assert_array_equal(o1, o2)
    assert not np.allclose(o1, o3), "a different generator must give a different draw"
    assert not np.allclose(o1, plain_out), "dropout at p=0.5 must change the output"
    np.testing.assert_array_equal(w1, plain_w)  # returned weights are pre-dropout
    np.testing.assert_array_equal(w2, plain_w)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_is_unbiased(p):
    # Many independent draws in one call: a broadcast batch of N identical problems.
    q, k, v = _qkv(seed=14, shape=(1, 2, 3, 4))
    N = 4000
    qb, kb, vb = (np.broadcast_to(a, (N,) + a.shape[1:]) for a in (q, k, v))
    out, w = an.scaled_dot_product_attention(
        qb, kb, vb, dropout_p=p, rng=np.random.default_rng(15), valid_lens=np.full(N, 2)
    )
    want, _ = an.scaled_dot_product_attention(q, k, v, valid_lens=np.array([2]))
    mean, std = out.mean(axis=0), out.std(axis=0)
    assert np.all(std > 0)
    # 5 standard errors: fails with probability ~1e-6 per coordinate for a correct op.
    assert np.all(np.abs(mean - want[0]) < 5 * std / np.sqrt(N)), np.abs(mean - want[0]).max()
    # Masked keys stay masked under dropout.
    assert np.all(w[:, :, :, 2:] == 0)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_probability_out_of_range_raises(p):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        an.scaled_dot_product_attention(q, k, v, dropout_p=p)


# --- NaN and inf --------------------------------------------------------------------------


def _masked_setup():
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((2, 2, 3, 4)) for _ in range(3))
    vl = np.array([2, 3])  # batch 0 masks key 2
    return q, k, v, vl


@pytest.mark.parametrize("where", ["k", "v", "bias"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_in_masked_position_does_not_leak(unchanged, where, bad):
    q, k, v, vl = _masked_setup()
    bias = np.zeros((2, 2, 3, 3))
    clean_out, clean_w = an.scaled_dot_product_attention(q, k, v, valid_lens=vl, bias=bias)
    arrays = {"k": k.copy(), "v": v.copy(), "bias": bias.copy()}
    if where == "bias":
        arrays["bias"][0, :, :, 2] = bad
    else:
        arrays[where][0, :, 2] = bad
    with unchanged(q, *arrays.values()), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out, w = an.scaled_dot_product_attention(q, **arrays, valid_lens=vl)
    np.testing.assert_allclose(out, clean_out, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(w, clean_w, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_in_attended_position_propagates(where):
    q, k, v, vl = _masked_setup()
    arrays = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
    if where == "q":
        arrays["q"][1, 0, 1, 0] = np.nan
    else:
        arrays[where][1, 0, 0, 0] = np.nan  # key 0 is attended by every query of batch 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out, _ = an.scaled_dot_product_attention(**arrays, valid_lens=vl)
    nan_rows = np.isnan(out).any(axis=-1)
    if where == "q":
        assert nan_rows[1, 0, 1] and nan_rows.sum() == 1
    else:
        assert np.all(nan_rows[1, 0]) and not nan_rows[0].any() and not nan_rows[1, 1].any()
