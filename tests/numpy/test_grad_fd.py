"""Every hand-written pullback against central finite differences in float64.

``check_vjp`` compares, for each positional argument (every parameter array of a
``MultiHeadParams``) and the ``bias`` option, the directional derivative
``<pullback(g), u>`` with a (Richardson-extrapolated) central difference of ``<g, f>``
along a random direction; several seeds give several directions. Fully masked rows must come back as
exact zeros, never NaN.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from attnkit.numpy import (
    MultiHeadParams,
    additive_attention,
    check_vjp,
    flash_attention,
    log_softmax,
    logsumexp,
    masked_softmax,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    vjp,
)

REL = 1e-6
SEEDS = (0, 1)

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "Tq=1": (2, 2, 2, 1, 5, 3, 3),
    "Tk=1": (2, 2, 2, 4, 1, 3, 3),
    "Tq<Tk": (1, 2, 2, 3, 6, 4, 4),
    "Tq>Tk": (1, 2, 2, 6, 3, 4, 4),
    "Dk!=Dv": (1, 2, 2, 4, 5, 3, 6),
    "GQA": (2, 4, 2, 3, 5, 3, 2),
    "MQA": (1, 3, 1, 4, 4, 2, 3),
}


def _options(case: str, shape: tuple[int, ...], rng: np.random.Generator) -> dict:
    B, H, _, Tq, Tk, _, _ = shape
    if case == "plain":
        return {}
    if case == "causal":
        return {"causal": True}
    if case == "window":
        return {"window": (1, 0)}
    if case == "window-both":
        return {"window": (0, 1), "causal": False}
    if case == "valid_lens":  # a 0 length gives a fully masked batch row
        return {"valid_lens": np.array([0, Tk][:B] if B > 1 else [max(Tk - 1, 0)])}
    if case == "valid_lens-2d":
        return {"valid_lens": rng.integers(0, Tk + 1, (B, Tq))}
    if case == "mask":
        mask = rng.random((B, 1, Tq, Tk)) < 0.6
        mask[..., 0, :] = False  # a fully masked query row
        return {"mask": mask}
    if case == "bias":
        return {"bias": rng.standard_normal((H, 1, Tk))}
    if case == "bias-full":
        bias = rng.standard_normal((B, H, Tq, Tk))
        bias[..., -1, 0] = -np.inf  # -inf in a bias excludes, like a mask
        return {"bias": bias}
    if case == "all":
        return {
            "causal": True,
            "window": (2, None),
            "mask": rng.random((Tq, Tk)) < 0.8,
            "valid_lens": rng.integers(0, Tk + 1, (B,)),
            "bias": rng.standard_normal((1, Tk)),
            "scale": 0.7,
        }
    raise AssertionError(case)


CASES = [
    "plain", "causal", "window", "window-both", "valid_lens", "valid_lens-2d", "mask",
    "bias", "bias-full", "all",
]


def _qkv(shape: tuple[int, ...], rng: np.random.Generator):
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    return (
        rng.standard_normal((B, H, Tq, Dk)),
        rng.standard_normal((B, Hkv, Tk, Dk)),
        rng.standard_normal((B, Hkv, Tk, Dv)),
    )


def _assert_fd(fn, *args, **options) -> None:
    for seed in SEEDS:
        errors = check_vjp(fn, *args, seed=seed, **options)
        assert errors, "nothing was checked"
        bad = {name: err for name, err in errors.items() if not err < REL}
        assert not bad, f"relative error >= {REL}: {bad} (all: {errors})"


def _assert_empty_rows_zero(fn, args, options, keep_rows) -> None:
    """Gradients are finite, and the query rows with no allowed key get exactly 0."""
    out, pullback = vjp(fn, *args, **options)
    grads = pullback(np.ones_like(out[0]))
    for g in grads:
        if g is not None:
            assert np.all(np.isfinite(g))
    if keep_rows is not None:
        dq = grads[0]
        empty = ~np.broadcast_to(keep_rows, dq.shape[:-1])
        assert np.all(dq[empty] == 0.0)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_sdpa_matches_finite_differences(shape, case) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((shape, case)).encode()))
    q, k, v = _qkv(shape, rng)
    options = _options(case, shape, rng)
    _assert_fd(scaled_dot_product_attention, q, k, v, **options)
    # rows with no allowed key: weights all zero
    _, w = scaled_dot_product_attention(q, k, v, **options)
    _assert_empty_rows_zero(scaled_dot_product_attention, (q, k, v), options, w.sum(-1) > 0)


BANDS = {
    "full": {},
    "causal": {"causal": True},
    "window(1,0)": {"window": (1, 0)},
    "window(0,2)": {"window": (0, 2)},
    "causal+window": {"window": (1, 1), "causal": True},
}


@pytest.mark.parametrize("band", list(BANDS.values()), ids=list(BANDS))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_flash_matches_finite_differences(shape, band) -> None:
    rng = np.random.default_rng(7)
    q, k, v = _qkv(shape, rng)
    _assert_fd(flash_attention, q, k, v, block_q=2, block_k=2, **band)
    _, lse = flash_attention(q, k, v, return_lse=True, **band)
    _assert_empty_rows_zero(flash_attention, (q, k, v),
                            {**band, "block_q": 2, "block_k": 3, "return_lse": True},
                            ~np.isneginf(lse))


ADDITIVE = {  # (B, Tq, Tk, Dq, Dk, Dv, hidden)
    "Tq=1": (2, 1, 4, 3, 3, 2, 5),
    "Tk=1": (2, 3, 1, 3, 3, 2, 5),
    "Tq<Tk": (1, 2, 5, 4, 3, 2, 3),
    "Tq>Tk": (2, 5, 2, 2, 4, 3, 4),
    "widths": (1, 3, 4, 2, 5, 6, 3),
}


@pytest.mark.parametrize("case", ["plain", "causal", "window", "valid_lens", "valid_lens-2d",
                                  "mask", "bias-full", "all"])
@pytest.mark.parametrize("shape", list(ADDITIVE.values()), ids=list(ADDITIVE))
def test_additive_matches_finite_differences(shape, case) -> None:
    B, Tq, Tk, Dq, Dk, Dv, h = shape
    rng = np.random.default_rng(11)
    args = (
        rng.standard_normal((B, Tq, Dq)), rng.standard_normal((B, Tk, Dk)),
        rng.standard_normal((B, Tk, Dv)), rng.standard_normal((Dq, h)),
        rng.standard_normal((Dk, h)), rng.standard_normal(h),
    )
    options = _options(case, (B, 1, 1, Tq, Tk, Dk, Dv), rng)
    options.pop("scale", None)  # additive scores are not scaled
    if "mask" in options:
        options["mask"] = options["mask"][:, 0] if options["mask"].ndim == 4 else options["mask"]
    if "bias" in options:
        options["bias"] = options["bias"][:, 0] if options["bias"].ndim == 4 else options["bias"]
    _assert_fd(additive_attention, *args, **options)
    _, w = additive_attention(*args, **options)
    _assert_empty_rows_zero(additive_attention, args, options, w.sum(-1) > 0)


MHA = {  # (E, H, Hkv, Dk, Dv, kdim, vdim, Eo, bias)
    "self": (6, 2, 2, 3, 3, None, None, None, True),
    "no-bias": (6, 2, 2, 3, 3, None, None, None, False),
    "cross": (5, 2, 2, 3, 2, 4, 3, 7, True),
    "gqa": (6, 4, 2, 2, 3, None, None, None, True),
    "mqa-cross": (4, 3, 1, 2, 2, 5, 2, 3, False),
}


@pytest.mark.parametrize("case", ["plain", "causal", "valid_lens", "mask", "bias", "all"])
@pytest.mark.parametrize("layout", list(MHA.values()), ids=list(MHA))
@pytest.mark.parametrize("Tq,Tk", [(3, 3), (1, 4), (4, 1), (2, 5)])
def test_mha_matches_finite_differences(layout, case, Tq, Tk) -> None:
    E, H, Hkv, Dk, Dv, kdim, vdim, Eo, bias = layout
    rng = np.random.default_rng(3)
    params = MultiHeadParams.init(
        E, H, num_kv_heads=Hkv, head_dim=Dk, v_head_dim=Dv, kdim=kdim, vdim=vdim,
        out_dim=Eo, bias=bias, rng=rng,
    )
    # non-zero biases, so their gradients meet every path
    params = params.map(lambda a: a + 0.3 * rng.standard_normal(a.shape))
    B = 2
    query = rng.standard_normal((B, Tq, E))
    key = rng.standard_normal((B, Tk, kdim or E))
    value = rng.standard_normal((B, Tk, vdim or E))
    options = _options(case, (B, H, Hkv, Tq, Tk, Dk, Dv), rng)
    _assert_fd(multi_head_attention, params, query, key, value, **options)
    if kdim is None and vdim is None and Tq == Tk:  # self-attention: key = value = query
        _assert_fd(multi_head_attention, params, query, **options)
        _assert_fd(multi_head_attention, params, query, key, **options)  # value = key


@pytest.mark.parametrize("fn", [softmax, log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_family_matches_finite_differences(fn, axis) -> None:
    rng = np.random.default_rng(5)
    x = 3.0 * rng.standard_normal((3, 4, 5))
    x[0, 1, 2] = -np.inf  # an excluded entry: gradient 0
    _assert_fd(fn, x, axis=axis)
    out, pullback = vjp(fn, x, axis=axis)
    (dx,) = pullback(rng.standard_normal(x.shape))
    assert dx[0, 1, 2] == 0.0
    assert np.all(np.isfinite(dx))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [-1, 0])
def test_logsumexp_matches_finite_differences(axis, keepdims) -> None:
    rng = np.random.default_rng(6)
    x = 3.0 * rng.standard_normal((3, 4))
    x[1, :] = -np.inf  # an empty row along axis -1
    x[0, 2] = -np.inf
    _assert_fd(logsumexp, x, axis=axis, keepdims=keepdims)
    out, pullback = vjp(logsumexp, x, axis=axis, keepdims=keepdims)
    (dx,) = pullback(np.ones_like(out))
    assert np.all(np.isfinite(dx)) and dx[0, 2] == 0.0
    if axis == -1:
        assert np.array_equal(dx[1], np.zeros(4))


@pytest.mark.parametrize("fn", [softmax, log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_family_all_excluded_row_gives_zero_gradient(fn) -> None:
    x = np.array([[1.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    _, pullback = vjp(fn, x)
    (dx,) = pullback(np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]]))
    assert np.array_equal(dx[1], np.zeros(3))
    assert dx[0, 2] == 0.0 and np.all(np.isfinite(dx))
    _assert_fd(fn, x)


@pytest.mark.parametrize(
    "lens", [np.array([2, 0, 5]), np.array([[1, 2, 0, 4]] * 3)], ids=["(B,)", "(B,Tq)"]
)
def test_masked_softmax_matches_finite_differences(lens) -> None:
    rng = np.random.default_rng(9)
    scores = rng.standard_normal((3, 4, 5))
    mask = rng.random((4, 5)) < 0.7
    _assert_fd(masked_softmax, scores, lens)
    _assert_fd(masked_softmax, scores, lens, mask=mask)
    out, pullback = vjp(masked_softmax, scores, lens, mask=mask)
    d_scores, d_lens = pullback(rng.standard_normal(scores.shape))
    assert d_lens is None  # lengths are not differentiable
    assert np.all(d_scores[out == 0] == 0.0)


@pytest.mark.parametrize(
    "shapes",
    [
        ((5, 4), (7, 4), (7, 3)),  # no batch or head axis
        ((3, 2, 4, 5), (1, 2, 6, 5), (1, 2, 6, 2)),  # k/v broadcast over the batch
        ((2, 1, 4, 5), (2, 1, 6, 5), (2, 1, 6, 2)),  # one head
        ((2, 3, 4, 6, 5), (2, 1, 2, 3, 5), (2, 1, 2, 3, 4)),  # two batch axes, one broadcast
    ],
    ids=["unbatched", "broadcast-kv", "one-head", "broadcast-middle"],
)
def test_sdpa_broadcast_shapes_match_finite_differences(shapes) -> None:
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    _assert_fd(scaled_dot_product_attention, q, k, v)
    _assert_fd(scaled_dot_product_attention, q, k, v, causal=True, bias=rng.standard_normal(
        (shapes[0][-2], shapes[1][-2])
    ))
