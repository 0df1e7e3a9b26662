"""The model-family variants on the NumPy oracle: softcap, sinks, segment_ids and top-left
causal, alone and combined with causal/window/GQA/bias, on scaled_dot_product_attention,
flash_attention and multi_head_attention: forward and gradients against the float64 loop
reference (attnkit.testing.reference_attention), pullbacks against central finite
differences, and the packed-document / padding properties they exist for."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.numpy import check_vjp, vjp
from attnkit.numpy.flash import flash_attention_backward
from attnkit.testing import reference_attention

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "Tq<Tk": (2, 2, 2, 5, 8, 4, 3),
    "Tq>Tk": (2, 2, 2, 8, 5, 4, 4),
    "GQA": (2, 4, 2, 6, 6, 3, 5),
    "MQA": (1, 3, 1, 7, 7, 5, 2),
}

VARIANTS = {
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": "*"},
    "segments": {"segment_ids": "*"},
    "top_left": {"causal": "top_left"},
    "top_left+window": {"causal": "top_left", "window": (2, None)},
    "softcap+causal+bias": {"softcap": 2.0, "causal": True, "bias": "*"},
    "sinks+window": {"sinks": "*", "window": (1, 1)},
    "sinks+segments+causal": {"sinks": "*", "segment_ids": "*", "causal": True},
    "all": {"softcap": 1.0, "sinks": "*", "segment_ids": "*", "causal": "top_left",
            "window": (3, 0), "bias": "*", "scale": 0.8},
}


def draw(shape: tuple[int, ...], case: dict, rng: np.random.Generator):
    """q, k, v and the keyword arguments of one case; ``"*"`` values are drawn."""
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    q = rng.standard_normal((B, H, Tq, Dk)) * 2
    k = rng.standard_normal((B, Hkv, Tk, Dk))
    v = rng.standard_normal((B, Hkv, Tk, Dv))
    kw = dict(case)
    if kw.get("sinks") == "*":
        kw["sinks"] = rng.standard_normal(H)
    if kw.get("bias") == "*":
        kw["bias"] = rng.standard_normal((H, 1, Tk))
    if kw.get("segment_ids") == "*":
        q_ids = np.sort(rng.integers(-1, 3, (B, Tq)), axis=-1)
        kv_ids = np.sort(rng.integers(-1, 3, (B, Tk)), axis=-1)
        q_ids[0, -1] = 7  # a query whose segment has no key: a fully masked row
        kv_ids[0, 0] = -1
        kw["segment_ids"] = (q_ids, kv_ids)
    return q, k, v, kw


def _seed(*parts: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


@pytest.mark.parametrize("case", list(VARIANTS), ids=list(VARIANTS))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_sdpa_and_flash_match_the_reference(shape, case) -> None:
    q, k, v, kw = draw(shape, VARIANTS[case], _seed(shape, case))
    rng = _seed("g", shape, case)
    d_out = rng.standard_normal(shape[:2] + (shape[3], shape[6]))
    ref = reference_attention(q, k, v, d_out=d_out, **kw)

    out, pullback = vjp(an.scaled_dot_product_attention, q, k, v, **kw)
    grads = pullback(d_out)
    np.testing.assert_allclose(out[0], ref.out, atol=1e-12)
    np.testing.assert_allclose(out[1], ref.weights, atol=1e-12)
    for got, want in zip(grads[:3], (ref.dq, ref.dk, ref.dv)):
        np.testing.assert_allclose(got, want, atol=1e-11)
    if "sinks" in kw:
        np.testing.assert_allclose(grads.sinks, ref.dsinks, atol=1e-11)

    if "bias" in kw:  # flash takes no bias
        return
    (f_out, lse), f_pull = vjp(an.flash_attention, q, k, v, block_q=3, block_k=2,
                               return_lse=True, **kw)
    np.testing.assert_allclose(f_out, ref.out, atol=1e-12)
    np.testing.assert_allclose(lse, ref.lse, atol=1e-12)
    f_grads = f_pull(d_out)
    for got, want in zip(f_grads[:3], (ref.dq, ref.dk, ref.dv)):
        np.testing.assert_allclose(got, want, atol=1e-11)
    if "sinks" in kw:
        np.testing.assert_allclose(f_grads.sinks, ref.dsinks, atol=1e-11)


@pytest.mark.parametrize("case", ["softcap", "sinks", "sinks+segments+causal", "all"])
@pytest.mark.parametrize("shape", [SHAPES["Tq>Tk"], SHAPES["GQA"]], ids=["Tq>Tk", "GQA"])
def test_pullbacks_match_finite_differences(shape, case) -> None:
    q, k, v, kw = draw(shape, VARIANTS[case], _seed("fd", shape, case))
    errors = check_vjp(an.scaled_dot_product_attention, q, k, v, **kw)
    kw.pop("bias", None)
    errors |= {f"flash {n}": e for n, e in
               check_vjp(an.flash_attention, q, k, v, block_q=4, block_k=3, **kw).items()}
    assert "sinks" in errors or "sinks" not in kw
    bad = {n: e for n, e in errors.items() if not e < 1e-6}
    assert not bad, f"relative error >= 1e-6: {bad}"


def test_mha_takes_the_variants_with_gradients() -> None:
    rng = np.random.default_rng(5)
    B, T, E, H = 2, 6, 8, 4
    params = an.MultiHeadParams.init(E, H, num_kv_heads=2, rng=rng)
    x = rng.standard_normal((B, T, E))
    ids = np.array([[0, 0, 0, 1, 1, -1], [0, 1, 1, 1, 1, 1]])
    kw = {"sinks": rng.standard_normal(H), "segment_ids": ids, "softcap": 2.0,
          "causal": "top_left"}
    errors = check_vjp(an.multi_head_attention, params, x, **kw)
    assert "sinks" in errors and max(errors.values()) < 1e-6, errors
    # heads one by one: the attention inside MHA is scaled_dot_product_attention
    y, w = an.multi_head_attention(params, x, **kw)
    q = np.einsum("bte,hed->bhtd", x, params.w_q) + params.b_q[:, None]
    k = np.einsum("bte,hed->bhtd", x, params.w_k) + params.b_k[:, None]
    v = np.einsum("bte,hed->bhtd", x, params.w_v) + params.b_v[:, None]
    _, w_ref = an.scaled_dot_product_attention(q, k, v, **kw)
    np.testing.assert_allclose(w, w_ref, atol=1e-12)
    assert np.all(y[0, -1] == params.b_o)  # the padding query: only the output bias


def test_sink_takes_the_mass_of_a_fully_masked_row() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    sinks = np.array([0.5, -2.0])
    out, lse = an.flash_attention(q, k, v, sinks=sinks, segment_ids=None, return_lse=True,
                                  window=None, causal=False, block_q=2, block_k=2)
    ref = reference_attention(q, k, v, sinks=sinks, mask=mask)
    assert np.all(ref.out[:, :, 1] == 0.0) and np.all(ref.lse[:, :, 1] == sinks[None, :])
    o2, w2 = an.scaled_dot_product_attention(q, k, v, sinks=sinks, mask=mask)
    assert np.all(o2[:, :, 1] == 0) and np.all(w2[:, :, 1] == 0)
    np.testing.assert_allclose(o2, ref.out, atol=1e-12)
    # weights sum to 1 - exp(z - lse) < 1
    np.testing.assert_allclose(lse, reference_attention(q, k, v, sinks=sinks).lse, atol=1e-12)
    np.testing.assert_allclose(
        an.scaled_dot_product_attention(q, k, v, sinks=sinks)[1].sum(-1),
        1 - np.exp(sinks[:, None] - lse), atol=1e-12,
    )


def test_top_left_causal_is_sdpa_is_causal() -> None:
    """``causal="top_left"`` keeps ``j <= i`` (torch's ``tril(ones(Tq, Tk))``), both ways."""
    for Tq, Tk in ((3, 5), (5, 3)):
        keep = an.attention_mask((Tq, Tk), causal="top_left")
        np.testing.assert_array_equal(keep, np.tril(np.ones((Tq, Tk), dtype=bool)))
    # window stays bottom-right aligned: with top_left it is ANDed around i + Tk - Tq
    keep = an.attention_mask((2, 4), causal="top_left", window=(1, None))
    want = np.tril(np.ones((2, 4), dtype=bool)) & (np.arange(4) >= np.arange(2)[:, None] + 1)
    np.testing.assert_array_equal(keep, want)


# -- what segment ids are for ------------------------------------------------------------


def test_packed_documents_equal_each_document_alone() -> None:
    rng = np.random.default_rng(2)
    lengths = np.array([3, 5, 1, 4])
    T, H = 15, 2  # the last two positions are padding
    ids = an.segment_ids_from_lengths(lengths, T)
    np.testing.assert_array_equal(ids[0], [0, 0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, -1, -1])
    q, k, v = (rng.standard_normal((1, H, T, 4)) for _ in range(3))
    v[:, :, -2:] = np.nan  # padding holds garbage: it must not leak
    sinks = rng.standard_normal(H)
    for fn in (an.scaled_dot_product_attention, an.flash_attention):
        kw = {"block_q": 4, "block_k": 4} if fn is an.flash_attention else {}
        out, pullback = vjp(fn, q, k, v, segment_ids=ids, causal=True, sinks=sinks, **kw)
        out = out[0] if isinstance(out, tuple) else out
        g = rng.standard_normal(out.shape)
        dq, dk, dv = pullback(g)
        start = 0
        for n in lengths:
            sl = slice(start, start + n)
            alone, pb = vjp(an.scaled_dot_product_attention, q[:, :, sl], k[:, :, sl],
                            v[:, :, sl], causal=True, sinks=sinks)
            np.testing.assert_allclose(out[:, :, sl], alone[0], atol=1e-12)
            for got, want in zip((dq, dk, dv), pb(g[:, :, sl])):
                np.testing.assert_allclose(got[:, :, sl], want, atol=1e-12)
            start += n
        assert np.all(out[:, :, -2:] == 0.0)  # padding queries: output 0 ...
        for grad in (dq, dk, dv):  # ... and zero gradients, padding keys too
            assert np.all(grad[:, :, -2:] == 0.0)


def test_left_padded_rows_equal_the_unpadded_sequence() -> None:
    rng = np.random.default_rng(3)
    T, pad = 7, 3
    real = np.array([[0] * pad + [1] * (T - pad), [1] * T])
    ids = an.segment_ids_from_padding_mask(real)
    np.testing.assert_array_equal(ids[0], [-1, -1, -1, 0, 0, 0, 0])
    q, k, v = (rng.standard_normal((2, 2, T, 3)) for _ in range(3))
    out, _ = an.scaled_dot_product_attention(q, k, v, segment_ids=ids, causal=True, softcap=3.0)
    alone, _ = an.scaled_dot_product_attention(q[:1, :, pad:], k[:1, :, pad:], v[:1, :, pad:],
                                               causal=True, softcap=3.0)
    np.testing.assert_allclose(out[:1, :, pad:], alone, atol=1e-12)
    assert np.all(out[0, :, :pad] == 0.0)
    full, _ = an.scaled_dot_product_attention(q[1:], k[1:], v[1:], causal=True, softcap=3.0)
    np.testing.assert_allclose(out[1:], full, atol=1e-12)


def test_segment_id_helpers() -> None:
    np.testing.assert_array_equal(
        an.segment_ids_from_cu_seqlens(np.array([0, 2, 2, 5]), 6), [[0, 0, 2, 2, 2, -1]]
    )
    np.testing.assert_array_equal(
        an.segment_ids_from_lengths(np.array([[1, 2], [3, 0]]), 4),
        [[0, 1, 1, -1], [0, 0, 0, -1]],
    )
    np.testing.assert_array_equal(
        an.segment_ids_from_padding_mask(np.array([[True, True, False]])), [[0, 0, -1]]
    )
    with pytest.raises(ValueError, match="sum to at most total=4"):
        an.segment_ids_from_lengths(np.array([3, 2]), 4)
    with pytest.raises(ValueError, match="start at 0"):
        an.segment_ids_from_cu_seqlens(np.array([1, 3]), 4)
    with pytest.raises(ValueError, match="only 0 and 1"):
        an.segment_ids_from_padding_mask(np.array([[0, 2]]))


# -- errors ------------------------------------------------------------------------------


def test_bad_variants_raise_naming_shapes_and_values() -> None:
    q = k = v = np.zeros((2, 3, 4, 5))
    ids = np.zeros((2, 4), dtype=np.int64)
    cases = [
        ({"segment_ids": np.zeros((2, 5), dtype=np.int64)}, ValueError,
         r"shape \(B, T\) = \(2, 4\) .* got \(2, 5\)"),
        ({"segment_ids": np.zeros((2, 4))}, TypeError, "must hold integers, got dtype float64"),
        ({"segment_ids": (ids, np.zeros((3, 4), dtype=np.int64))}, ValueError,
         r"kv_ids must have shape \(B, Tk\) = \(2, 4\) .* got \(3, 4\)"),
        ({"segment_ids": (ids, ids, ids)}, ValueError, "got 3 items"),
        ({"sinks": np.zeros(2)}, ValueError, r"shape \(H,\) = \(3,\).* got \(2,\)"),
        ({"sinks": np.zeros(3, dtype=np.int64)}, TypeError, "sinks must hold floats"),
        ({"softcap": 0.0}, ValueError, "softcap must be a positive"),
        ({"softcap": -1.0}, ValueError, "softcap must be a positive"),
        ({"softcap": True}, TypeError, "softcap"),
        ({"causal": "bottom-right"}, ValueError, "'bottom_right' or 'top_left'"),
    ]
    for fn in (an.scaled_dot_product_attention, an.flash_attention):
        for kw, err, match in cases:
            with pytest.raises(err, match=match):
                fn(q, k, v, **kw)
    with pytest.raises(ValueError, match=r"Tq=4, Tk=6: pass a pair"):
        an.scaled_dot_product_attention(q, np.zeros((2, 3, 6, 5)), np.zeros((2, 3, 6, 5)),
                                         segment_ids=ids)


def test_flash_backward_returns_d_sinks_only_with_sinks() -> None:
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    out, lse = an.flash_attention(q, k, v, return_lse=True)
    assert len(flash_attention_backward(out, q, k, v, out, lse)) == 3
    z = np.zeros(2)
    out, lse = an.flash_attention(q, k, v, sinks=z, return_lse=True)
    assert len(flash_attention_backward(out, q, k, v, out, lse, sinks=z)) == 4
