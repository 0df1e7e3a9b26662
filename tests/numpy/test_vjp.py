"""The ``vjp`` entry point: outputs, gradient tuples, bias gradients, dropout, errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from attnkit.numpy import (
    Grads,
    MultiHeadParams,
    additive_attention,
    check_vjp,
    flash_attention,
    log_softmax,
    logsumexp,
    masked_softmax,
    merge_partials,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    vjp,
)
from attnkit.numpy.flash import flash_attention_backward

vjp_module = sys.modules["attnkit.numpy.vjp"]


def _calls(rng: np.random.Generator):
    """(fn, args, options) for every op vjp supports."""
    q = rng.standard_normal((2, 4, 3, 5))
    k = rng.standard_normal((2, 2, 6, 5))
    v = rng.standard_normal((2, 2, 6, 7))
    params = MultiHeadParams.init(8, 2, rng=rng)
    x = rng.standard_normal((2, 4, 8))
    return [
        (softmax, (rng.standard_normal((3, 4)),), {"axis": 0}),
        (log_softmax, (rng.standard_normal((3, 4)),), {}),
        (logsumexp, (rng.standard_normal((3, 4)),), {"axis": 0, "keepdims": True}),
        (masked_softmax, (rng.standard_normal((2, 3, 4)), np.array([1, 3])), {}),
        (scaled_dot_product_attention, (q, k, v), {"causal": True}),
        (
            additive_attention,
            (q[:, 0], k[:, 0], v[:, 0], rng.standard_normal((5, 3)),
             rng.standard_normal((5, 3)), rng.standard_normal(3)),
            {"valid_lens": np.array([2, 6])},
        ),
        (flash_attention, (q, k, v),
         {"window": (2, 1), "block_q": 2, "block_k": 4, "return_lse": True}),
        (multi_head_attention, (params, x), {"causal": True}),
    ]


@pytest.mark.parametrize("index", range(8))
def test_out_is_exactly_what_fn_returns_and_grads_match_args(index) -> None:
    fn, args, options = _calls(np.random.default_rng(0))[index]
    copies = [a.copy() for a in args]
    out, pullback = vjp(fn, *args, **options)
    expected = fn(*args, **options)
    if isinstance(expected, tuple):
        assert isinstance(out, tuple) and len(out) == len(expected)
        for a, b in zip(out, expected):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        first = out[0]
    else:
        assert out.dtype == expected.dtype and np.array_equal(out, expected)
        first = out
    grads = pullback(np.ones_like(first))
    assert isinstance(grads, Grads) and isinstance(grads, tuple)
    assert len(grads) == len(args)
    for g, a in zip(grads, args):
        if isinstance(a, MultiHeadParams):
            assert [n for n, _ in g.items()] == [n for n, _ in a.items()]
            for (_, ga), (_, aa) in zip(g.items(), a.items()):
                assert ga.shape == aa.shape and ga.dtype == aa.dtype
        elif np.issubdtype(a.dtype, np.integer):
            assert g is None  # valid_lens
        else:
            assert g.shape == a.shape and g.dtype == a.dtype
            assert np.all(np.isfinite(g))
    assert grads.bias is None
    # nothing was written into the caller's arrays
    for a, c in zip(args, copies):
        if isinstance(a, MultiHeadParams):
            assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a.items(), c.items()))
        else:
            assert np.array_equal(a, c)


def test_float32_inputs_give_float32_gradients() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    (out, _), pullback = vjp(scaled_dot_product_attention, q, k, v)
    grads64 = vjp(scaled_dot_product_attention, *(x.astype(np.float64) for x in (q, k, v)))[1](
        np.ones(out.shape)
    )
    for g, g64 in zip(pullback(np.ones_like(out)), grads64):
        assert g.dtype == np.float32
        assert np.max(np.abs(g - g64)) < 1e-5


@pytest.mark.parametrize("bias_shape", [(), (6,), (4, 1, 6), (2, 4, 3, 6), (1, 3, 1)])
def test_bias_gradient_comes_back_in_the_bias_shape(bias_shape) -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 3, 5))
    k = rng.standard_normal((2, 4, 6, 5))
    v = rng.standard_normal((2, 4, 6, 2))
    bias = rng.standard_normal(bias_shape)
    (out, _), pullback = vjp(scaled_dot_product_attention, q, k, v, bias=bias)
    g = rng.standard_normal(out.shape)
    grads = pullback(g)
    assert grads.bias.shape == bias_shape
    # a scalar bias shifts every score equally: softmax cannot see it
    if bias_shape == ():
        assert abs(float(grads.bias)) < 1e-12
    else:
        errors = check_vjp(scaled_dot_product_attention, q, k, v, bias=bias)
        assert errors["bias"] < 1e-6, errors


def test_mha_positional_key_value_and_none() -> None:
    rng = np.random.default_rng(3)
    params = MultiHeadParams.init(6, 2, kdim=4, vdim=3, bias=False, rng=rng)
    x = rng.standard_normal((2, 3, 6))
    key = rng.standard_normal((2, 5, 4))
    value = rng.standard_normal((2, 5, 3))
    (out, _), pullback = vjp(multi_head_attention, params, x, key, value)
    d_params, dx, dk, dv = pullback(np.ones_like(out))
    assert isinstance(d_params, MultiHeadParams) and d_params.b_q is None
    assert dk.shape == key.shape and dv.shape == value.shape

    sq = MultiHeadParams.init(6, 2, rng=rng)
    (out, _), pullback = vjp(multi_head_attention, sq, x, None, None)
    grads = pullback(np.ones_like(out))
    assert len(grads) == 4 and grads[2] is None and grads[3] is None
    # self-attention: the query gradient collects the key and value roles too
    (_, _), explicit = vjp(multi_head_attention, sq, x, x, x)
    _, dq_e, dk_e, dv_e = explicit(np.ones_like(out))
    assert np.allclose(grads[1], dq_e + dk_e + dv_e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa+mask"])
def test_dropout_backward_uses_the_forward_mask(gqa) -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4 if gqa else 2, 4, 3))
    k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(2))
    p = 0.4
    opts = {"dropout_p": p, "mask": rng.random((4, 5)) < 0.7} if gqa else {"dropout_p": p}
    (out, _), pullback = vjp(
        scaled_dot_product_attention, q, k, v, rng=np.random.default_rng(9), **opts
    )
    same, _ = scaled_dot_product_attention(q, k, v, rng=np.random.default_rng(9), **opts)
    assert np.array_equal(out, same)
    g = rng.standard_normal(out.shape)
    grads = pullback(g)

    def f(qq, kk, vv):  # the same dropout mask on every call
        res, _ = scaled_dot_product_attention(qq, kk, vv, rng=np.random.default_rng(9), **opts)
        return float(np.sum(res * g))

    eps = 1e-6
    for i, (x, gx) in enumerate(zip((q, k, v), grads)):
        u = rng.standard_normal(x.shape)
        args_p = [q, k, v]
        args_m = [q, k, v]
        args_p[i], args_m[i] = x + eps * u, x - eps * u
        numeric = (f(*args_p) - f(*args_m)) / (2 * eps)
        assert abs(np.sum(gx * u) - numeric) < 1e-6 * max(1.0, abs(numeric))
    # and the mask matters: without dropout the gradient differs
    no_drop = vjp(scaled_dot_product_attention, q, k, v, mask=opts.get("mask"))[1](g)
    assert not np.allclose(no_drop[2], grads[2])


def test_mha_dropout_backward_uses_the_forward_mask() -> None:
    rng = np.random.default_rng(10)
    params = MultiHeadParams.init(6, 2, rng=rng)
    x = rng.standard_normal((2, 4, 6))
    opts = {"dropout_p": 0.3}
    (out, _), pullback = vjp(multi_head_attention, params, x, rng=np.random.default_rng(1), **opts)
    g = rng.standard_normal(out.shape)
    d_params, dx = pullback(g)

    def f(pp, xx):
        res, _ = multi_head_attention(pp, xx, rng=np.random.default_rng(1), **opts)
        return float(np.sum(res * g))

    eps = 1e-6
    u = rng.standard_normal(x.shape)
    numeric = (f(params, x + eps * u) - f(params, x - eps * u)) / (2 * eps)
    assert abs(np.sum(dx * u) - numeric) < 1e-6 * max(1.0, abs(numeric))
    for name, w in params.items():
        du = rng.standard_normal(w.shape)
        plus = params.map(lambda a, w=w, du=du: a + eps * du if a is w else a)
        minus = params.map(lambda a, w=w, du=du: a - eps * du if a is w else a)
        numeric = (f(plus, x) - f(minus, x)) / (2 * eps)
        analytic = np.sum(getattr(d_params, name) * du)
        assert abs(analytic - numeric) < 1e-6 * max(1.0, abs(numeric)), name


def test_nan_in_masked_values_does_not_leak_into_gradients() -> None:
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    v[..., 2, :] = np.nan  # key 2 is masked for every query
    mask = np.ones((3, 3), dtype=bool)
    mask[:, 2] = False
    (out, _), pullback = vjp(scaled_dot_product_attention, q, k, v, mask=mask)
    dq, dk, dv = pullback(np.ones_like(out))
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    clean = v.copy()
    clean[..., 2, :] = 0.0
    ref = vjp(scaled_dot_product_attention, q, k, clean, mask=mask)[1](np.ones_like(out))
    assert np.allclose(dq, ref[0], rtol=0, atol=1e-14)


def test_pullback_rejects_a_wrong_cotangent_shape() -> None:
    q = np.zeros((2, 3, 4))
    (out, _), pullback = vjp(scaled_dot_product_attention, q, q, q)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        pullback(np.zeros((2, 3, 5)))


def test_vjp_rejects_an_unsupported_function() -> None:
    with pytest.raises(TypeError, match="scaled_dot_product_attention"):
        vjp(merge_partials, np.zeros((2, 3)), np.zeros(2), np.zeros((2, 3)), np.zeros(2))


def test_check_vjp_catches_a_wrong_gradient(monkeypatch) -> None:
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    assert max(check_vjp(scaled_dot_product_attention, q, k, v).values()) < 1e-6
    real = vjp_module.sdpa_backward

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv, ds, d_sinks = real(*args, **kwargs)
        return dq * (1 + 1e-5), dk, dv, ds, d_sinks

    monkeypatch.setattr(vjp_module, "sdpa_backward", off_by_a_little)
    errors = check_vjp(scaled_dot_product_attention, q, k, v)
    assert errors["q"] > 1e-6 and errors["k"] < 1e-6


def test_nan_in_masked_queries_and_keys_does_not_leak() -> None:
    """NaN-padded batches: padded keys (valid_lens) and fully masked query rows hold NaN."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 2, 4, 3)) for _ in range(3))
    lens = np.array([2, 4])
    for x in (k, v):
        x[0, :, 2:, :] = np.nan  # keys past the valid length
    clean = [x.copy() for x in (q, k, v)]
    for x in clean[1:]:
        x[0, :, 2:, :] = 0.0
    g = rng.standard_normal((2, 2, 4, 3))
    grads = vjp(scaled_dot_product_attention, q, k, v, valid_lens=lens)[1](g)
    ref = vjp(scaled_dot_product_attention, *clean, valid_lens=lens)[1](g)
    for a, b in zip(grads, ref):
        assert np.array_equal(a, b)

    # a query row with nothing allowed (causal, Tq > Tk) may hold NaN too
    q2 = rng.standard_normal((1, 5, 3))
    k2, v2 = rng.standard_normal((1, 3, 3)), rng.standard_normal((1, 3, 3))
    q2[0, 0] = np.nan  # row 0 sees no key: j <= 0 + 3 - 5 < 0
    for fn in (scaled_dot_product_attention, flash_attention):
        grads = vjp(fn, q2, k2, v2, causal=True)[1](np.ones((1, 5, 3)))
        assert all(np.all(np.isfinite(x)) for x in grads[1:]), fn.__name__
        assert np.all(np.isfinite(grads[0][0, 1:]))

    # flash: NaN in keys/values outside the band (query i sees only key i + 3)
    q3 = rng.standard_normal((1, 3, 3))
    k3, v3 = rng.standard_normal((1, 6, 3)), rng.standard_normal((1, 6, 3))
    out, lse = flash_attention(q3, k3, v3, window=(0, 0), block_q=2, block_k=2, return_lse=True)
    k3n, v3n = k3.copy(), v3.copy()
    k3n[0, :3], v3n[0, :3] = np.nan, np.nan  # keys no query sees
    g3 = rng.standard_normal(out.shape)
    band = {"window": (0, 0), "block_q": 2, "block_k": 2}
    dirty = flash_attention_backward(g3, q3, k3n, v3n, out, lse, **band)
    clean = flash_attention_backward(g3, q3, k3, v3, out, lse, **band)
    for a, b in zip(dirty, clean):
        assert np.array_equal(a, b)

    # MHA with NaN-padded key/value inputs and valid_lens
    params = MultiHeadParams.init(6, 2, rng=rng)
    query = rng.standard_normal((2, 3, 6))
    memory = rng.standard_normal((2, 5, 6))
    memory[1, 3:] = np.nan
    (out, _), pullback = vjp(
        multi_head_attention, params, query, memory, memory, valid_lens=np.array([5, 3])
    )
    d_params, d_query, d_key, d_value = pullback(np.ones_like(out))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(d_query))
    assert all(np.all(np.isfinite(a)) for _, a in d_params.items())
    assert np.all(np.isfinite(d_key[1, :3])) and np.all(d_key[1, 3:] == 0.0)


def test_nan_in_additive_masked_keys_does_not_leak() -> None:
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    v = rng.standard_normal((2, 5, 2))
    w = [rng.standard_normal((4, 6)), rng.standard_normal((4, 6)), rng.standard_normal(6)]
    k[1, 3:], v[1, 3:] = np.nan, np.nan
    (out, _), pullback = vjp(additive_attention, q, k, v, *w, valid_lens=np.array([5, 3]))
    grads = pullback(np.ones_like(out))
    assert np.all(np.isfinite(out))
    for name, g in zip(("q", "k[valid]", "v[valid]", "w_q", "w_k", "w_v"),
                       (grads[0], grads[1][1, :3], grads[2][1, :3], *grads[3:])):
        assert np.all(np.isfinite(g)), name


def test_bool_mask_and_minus_inf_bias_have_the_same_gradients() -> None:
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((2, 2, 6, 5))
    v = rng.standard_normal((2, 2, 6, 4))
    mask = rng.random((2, 1, 3, 6)) < 0.5
    mask[0, 0, 1] = False  # a fully masked row
    bias = np.where(mask, 0.0, -np.inf)
    g = rng.standard_normal((2, 4, 3, 4))
    by_mask = vjp(scaled_dot_product_attention, q, k, v, mask=mask)[1](g)
    by_bias = vjp(scaled_dot_product_attention, q, k, v, bias=bias)[1](g)
    for a, b in zip(by_mask, by_bias):
        assert np.allclose(a, b, rtol=1e-13, atol=1e-15)
    assert np.all(by_bias.bias[~mask] == 0.0)  # an excluded score cannot move the output


def test_permuting_keys_permutes_their_gradients() -> None:
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 2, n, 3)) for n in (4, 7, 7))
    lens = np.array([5, 7])
    perm = np.array([3, 0, 4, 1, 2, 6, 5])  # keeps keys 0..4 (valid in batch 0) among 0..4
    mask = rng.random((4, 7)) < 0.8
    g = rng.standard_normal((2, 2, 4, 3))
    for fn_opts in ({"mask": mask}, {"mask": mask, "valid_lens": lens}):
        dq, dk, dv = vjp(scaled_dot_product_attention, q, k, v, **fn_opts)[1](g)
        opts = {**fn_opts, "mask": mask[:, perm]}
        _, pullback = vjp(scaled_dot_product_attention, q, k[..., perm, :], v[..., perm, :], **opts)
        pq, pk, pv = pullback(g)
        assert np.allclose(pq, dq, rtol=1e-12, atol=1e-14)
        assert np.allclose(pk, dk[..., perm, :], rtol=1e-12, atol=1e-14)
        assert np.allclose(pv, dv[..., perm, :], rtol=1e-12, atol=1e-14)
