"""Hypothesis properties from DESIGN.md ("Tests"), on the NumPy reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import attnkit.numpy as an

PROPERTY = settings(max_examples=50, deadline=None)
values = st.floats(-4.0, 4.0, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def problems(draw, masked=True):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D/Dv) and a bool mask (B, H, Tq, Tk) or None."""
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 2))
    Tq, Tk = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    Dk, Dv = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    q = draw(hnp.arrays(np.float64, (B, H, Tq, Dk), elements=values))
    k = draw(hnp.arrays(np.float64, (B, Hkv, Tk, Dk), elements=values))
    v = draw(hnp.arrays(np.float64, (B, Hkv, Tk, Dv), elements=values))
    mask = draw(hnp.arrays(np.bool_, (B, H, Tq, Tk))) if masked and draw(st.booleans()) else None
    return q, k, v, mask


@PROPERTY
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                 elements=st.floats(-50, 50) | st.just(-np.inf)),
    shift=st.floats(-1e3, 1e3),
    axis=st.integers(-1, 0),
)
def test_softmax_shift_invariance(x, shift, axis):
    a = an.softmax(x, axis=axis)
    b = an.softmax(x + shift, axis=axis)
    # x + shift rounds the logits by up to eps * |shift|: that bounds the difference.
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * max(1.0, abs(shift)))
    la, lb = an.logsumexp(x, axis=axis), an.logsumexp(x + shift, axis=axis)
    finite = np.isfinite(la)
    np.testing.assert_array_equal(np.isfinite(lb), finite)
    np.testing.assert_allclose(lb[finite], la[finite] + shift, rtol=1e-12, atol=1e-9)


@PROPERTY
@given(p=problems(), causal=st.booleans())
def test_weights_sum_to_one_over_allowed_keys(p, causal):
    q, k, v, mask = p
    out, w = an.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    Tq, Tk = q.shape[-2], k.shape[-2]
    keep = np.broadcast_to(an.causal_mask(Tq, Tk) if causal else True, w.shape)
    if mask is not None:
        keep = keep & mask
    assert np.all(w[~keep] == 0.0)
    rows = keep.any(axis=-1)
    np.testing.assert_allclose(w.sum(axis=-1)[rows], 1.0, rtol=1e-13)
    assert np.all(w.sum(axis=-1)[~rows] == 0.0) and np.all(out[~rows] == 0.0)


@PROPERTY
@given(p=problems(), data=st.data())
def test_permuting_keys_and_values_together_leaves_output_unchanged(p, data):
    q, k, v, mask = p
    Tk = k.shape[-2]
    perm = np.array(data.draw(st.permutations(range(Tk))))
    bias = data.draw(hnp.arrays(np.float64, (Tk,), elements=values))
    out, w = an.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    out_p, w_p = an.scaled_dot_product_attention(
        q, k[..., perm, :], v[..., perm, :],
        mask=None if mask is None else mask[..., perm], bias=bias[perm],
    )
    np.testing.assert_allclose(out_p, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_p, w[..., perm], rtol=1e-12, atol=1e-15)


@PROPERTY
@given(p=problems(masked=False), data=st.data())
def test_chunks_merged_by_lse_equal_the_whole(p, data):
    q, k, v, _ = p
    Tk = k.shape[-2]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, Tk), max_size=3)) + [Tk]))
    whole = an.flash_attention(q, k, v, block_q=2, block_k=3, return_lse=True)
    # Start from "no key seen": output 0, lse -inf, then fold the chunks in one by one.
    out = np.zeros(whole[0].shape)
    lse = np.full(whole[1].shape, -np.inf)
    start = 0
    for stop in cuts:
        part = an.flash_attention(q, k[..., start:stop, :], v[..., start:stop, :], return_lse=True)
        out, lse = an.merge_partials(out, lse, *part)
        start = stop
    np.testing.assert_allclose(out, whole[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, whole[1], rtol=1e-12, atol=1e-12)


@PROPERTY
@given(p=problems(), window=st.tuples(st.none() | st.integers(0, 3), st.none() | st.integers(0, 3)))
def test_output_within_hull_of_attended_values(p, window):
    q, k, v, mask = p
    out, w = an.scaled_dot_product_attention(q, k, v, mask=mask, window=window)
    G = q.shape[1] // k.shape[1]
    for b, h, i in np.ndindex(*out.shape[:-1]):
        attended = v[b, h // G][w[b, h, i] > 0]
        if attended.size == 0:
            assert np.all(out[b, h, i] == 0.0)
            continue
        slack = 1e-12 * (1.0 + np.abs(attended).max())
        assert np.all(out[b, h, i] >= attended.min(axis=0) - slack)
        assert np.all(out[b, h, i] <= attended.max(axis=0) + slack)


@PROPERTY
@given(p=problems(masked=False), data=st.data())
def test_bool_mask_equals_zero_or_neg_inf_bias(p, data):
    q, k, v, _ = p
    shape = q.shape[:-1] + (k.shape[-2],)
    mask = data.draw(hnp.arrays(np.bool_, shape))
    bias = np.where(mask, 0.0, -np.inf)
    a = an.scaled_dot_product_attention(q, k, v, mask=mask)
    b = an.scaled_dot_product_attention(q, k, v, bias=bias)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])

