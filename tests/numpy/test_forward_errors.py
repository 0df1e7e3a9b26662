"""Every error case of DESIGN.md ("Errors") raises ValueError/TypeError naming the shapes,
and no input is modified on the way to the error."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attnkit.numpy as an


def shape(*dims):
    """The regex for a shape as NumPy prints it: ``(2, 3, 4)``."""
    return re.escape(str(tuple(dims)))


def _qkv(q_shape, k_shape, v_shape):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(s) for s in (q_shape, k_shape, v_shape))


OPS = {
    "sdpa": lambda q, k, v, **kw: an.scaled_dot_product_attention(q, k, v, **kw),
    "flash": lambda q, k, v, **kw: an.flash_attention(q, k, v, **kw),
}


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
@pytest.mark.parametrize(
    "shapes,pattern",
    [
        (((1, 2, 4, 8), (1, 2, 5, 7), (1, 2, 5, 7)),
         rf"Dk.*q {shape(1, 2, 4, 8)}.*Dk=8.*k {shape(1, 2, 5, 7)}.*Dk=7"),
        (((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8)),
         rf"k {shape(1, 2, 5, 8)}, v {shape(1, 2, 6, 8)}"),
        (((1, 6, 4, 8), (1, 4, 5, 8), (1, 4, 5, 8)),
         rf"H=6 .* Hkv=4.*q {shape(1, 6, 4, 8)}, k {shape(1, 4, 5, 8)}"),
        (((1, 2, 4, 8), (1, 3, 5, 8), (1, 2, 5, 8)),
         rf"k {shape(1, 3, 5, 8)}, v {shape(1, 2, 5, 8)}"),
        (((2, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8)),
         rf"q {shape(2, 2, 4, 8)} and k {shape(3, 2, 5, 8)}"),
        (((4, 8), (1, 5, 8), (1, 5, 8)), rf"q {shape(4, 8)}, k {shape(1, 5, 8)}"),
        (((8,), (5, 8), (5, 8)), rf"q {shape(8)}"),
    ],
    ids=["Dk", "Tk-of-k-vs-v", "H%Hkv", "Hkv-of-k-vs-v", "batch", "ndim", "1-D"],
)
def test_bad_qkv_shapes(unchanged, op, shapes, pattern):
    q, k, v = _qkv(*shapes)
    with unchanged(q, k, v), pytest.raises(ValueError, match=pattern):
        op(q, k, v)


@pytest.mark.parametrize(
    "valid_lens,err,pattern",
    [
        (np.array([1, 2, 3]), ValueError,
         rf"valid_lens of shape {shape(3)} .* {shape(2, 3, 4, 5)}"),
        (np.array([[1, 2]]), ValueError,
         rf"valid_lens of shape {shape(1, 2)}.*\(B, Tq\) = {shape(2, 4)}"),
        (np.ones((2, 4, 1), int), ValueError, rf"valid_lens of shape {shape(2, 4, 1)}"),
        (np.array([1, 6]), ValueError, r"valid_lens must lie in \[0, 5\].*max 6"),
        (np.array([-1, 2]), ValueError, r"valid_lens must lie in \[0, 5\].*min -1"),
        (np.array([1.5, 2.0]), TypeError, r"valid_lens must hold whole numbers"),
        (np.array([True, False]), TypeError, r"valid_lens must hold integers, got dtype bool"),
    ],
    ids=["B-mismatch", "Tq-mismatch", "3-D", "too-long", "negative", "fraction", "bool"],
)
def test_bad_valid_lens(unchanged, valid_lens, err, pattern):
    q, k, v = _qkv((2, 3, 4, 2), (2, 3, 5, 2), (2, 3, 5, 2))
    with unchanged(q, k, v, valid_lens), pytest.raises(err, match=pattern):
        an.scaled_dot_product_attention(q, k, v, valid_lens=valid_lens)


def test_bad_valid_lens_in_masked_softmax_and_sequence_mask():
    with pytest.raises(ValueError, match=rf"valid_lens of shape {shape(3)}.*{shape(2, 4, 5)}"):
        an.masked_softmax(np.zeros((2, 4, 5)), np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 5\]"):
        an.masked_softmax(np.zeros((2, 4, 5)), np.array([1, 7]))
    with pytest.raises(ValueError, match=rf"\(B,\) or \(B, Tq\), got {shape(1, 1, 2)}"):
        an.sequence_mask(np.ones((1, 1, 2), int), 3)


@pytest.mark.parametrize(
    "mask_shape", [(4, 4), (3, 1, 1, 1), (2, 3, 4, 5, 1)], ids=["Tk", "B", "extra-dim"]
)
def test_mask_not_broadcastable(unchanged, mask_shape):
    q, k, v = _qkv((2, 3, 4, 2), (2, 3, 5, 2), (2, 3, 5, 2))
    mask = np.ones(mask_shape, dtype=bool)
    pattern = (
        rf"mask of shape {shape(*mask_shape)} is not broadcastable to scores {shape(2, 3, 4, 5)}"
    )
    with unchanged(q, k, v, mask), pytest.raises(ValueError, match=pattern):
        an.scaled_dot_product_attention(q, k, v, mask=mask)
    with pytest.raises(ValueError, match=rf"mask of shape {shape(*mask_shape)}"):
        an.masked_softmax(np.zeros((2, 3, 4, 5)), mask=mask)


def test_bias_not_broadcastable():
    q, k, v = _qkv((2, 3, 4, 2), (2, 3, 5, 2), (2, 3, 5, 2))
    with pytest.raises(ValueError, match=rf"bias of shape {shape(4, 4)}.*{shape(2, 3, 4, 5)}"):
        an.scaled_dot_product_attention(q, k, v, bias=np.zeros((4, 4)))


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint8])
def test_non_bool_mask_is_a_type_error(unchanged, dtype):
    q, k, v = _qkv((1, 1, 2, 2), (1, 1, 3, 2), (1, 1, 3, 2))
    mask = np.ones((2, 3), dtype=dtype)
    pattern = rf"mask must be bool.*dtype {np.dtype(dtype)}"
    with unchanged(mask), pytest.raises(TypeError, match=pattern):
        an.scaled_dot_product_attention(q, k, v, mask=mask)
    with pytest.raises(TypeError, match=pattern):
        an.masked_softmax(np.zeros((2, 3)), mask=mask)


def test_bad_window():
    q, k, v = _qkv((1, 1, 2, 2), (1, 1, 3, 2), (1, 1, 3, 2))
    with pytest.raises(TypeError, match=r"window must be a \(left, right\) pair, got 3"):
        an.scaled_dot_product_attention(q, k, v, window=3)
    with pytest.raises(TypeError, match=r"window left must be an int or None, got 1.5"):
        an.scaled_dot_product_attention(q, k, v, window=(1.5, None))
    with pytest.raises(TypeError, match=r"window must be a \(left, right\) pair"):
        an.flash_attention(q, k, v, window=(1, 2, 3))
    with pytest.raises(TypeError, match=r"window right must be an int or None, got 0.5"):
        an.flash_attention(q, k, v, window=(None, 0.5))


def test_non_real_inputs_are_type_errors():
    q, k, v = _qkv((1, 1, 2, 2), (1, 1, 3, 2), (1, 1, 3, 2))
    with pytest.raises(TypeError, match=r"q must be a real array, got dtype complex128"):
        an.scaled_dot_product_attention(q.astype(complex), k, v)
    with pytest.raises(TypeError, match=r"dtype complex128"):
        an.softmax(np.zeros(3, dtype=complex))


def test_additive_attention_bad_widths():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 6)), rng.standard_normal(
        (2, 5, 2))
    w_q, w_k, w_v = np.zeros((4, 8)), np.zeros((6, 8)), np.zeros(8)
    with pytest.raises(ValueError, match=rf"w_q {shape(3, 8)} must take q's width 4"):
        an.additive_attention(q, k, v, np.zeros((3, 8)), w_k, w_v)
    with pytest.raises(ValueError, match=rf"hidden sizes differ: w_q {shape(4, 8)}, "
                       rf"w_k {shape(6, 8)}, w_v {shape(7)}"):
        an.additive_attention(q, k, v, w_q, w_k, np.zeros(7))
    with pytest.raises(ValueError, match=rf"k {shape(2, 5, 6)}, v {shape(2, 4, 2)}"):
        an.additive_attention(q, k, v[:, :4], w_q, w_k, w_v)


def test_multi_head_params_bad_shapes():
    w = np.zeros
    with pytest.raises(ValueError, match=r"H=3, w_k Hkv=2.*H % Hkv == 0"):
        an.MultiHeadParams(w((3, 4, 2)), w((2, 4, 2)), w((2, 4, 2)), w((6, 4)))
    with pytest.raises(ValueError, match=rf"w_q {shape(2, 4, 2)} and w_k {shape(2, 4, 3)}"):
        an.MultiHeadParams(w((2, 4, 2)), w((2, 4, 3)), w((2, 4, 2)), w((4, 4)))
    with pytest.raises(ValueError, match=rf"w_o {shape(5, 4)} must have H\*Dv = 4 rows"):
        an.MultiHeadParams(w((2, 4, 2)), w((2, 4, 2)), w((2, 4, 2)), w((5, 4)))
    with pytest.raises(ValueError, match=rf"b_q has shape {shape(4)}, expected {shape(2, 2)}"):
        an.MultiHeadParams(w((2, 4, 2)), w((2, 4, 2)), w((2, 4, 2)), w((4, 4)), b_q=w(4))
    with pytest.raises(ValueError, match=rf"w_q of shape {shape(4, 7)} is not \(E, 2\*D\)"):
        an.MultiHeadParams.from_flat(w((4, 7)), w((4, 6)), w((4, 6)), w((6, 4)), num_heads=2)


def test_multi_head_attention_bad_inputs():
    p = an.MultiHeadParams.init(6, 2, kdim=5, rng=np.random.default_rng(0))
    x = np.zeros((2, 3, 6))
    with pytest.raises(ValueError, match=rf"query must be \(B, T, 6\), got {shape(2, 3, 5)}"):
        an.multi_head_attention(p, np.zeros((2, 3, 5)), np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match=rf"key must be \(B, T, 5\), got {shape(2, 4, 6)}"):
        an.multi_head_attention(p, x, np.zeros((2, 4, 6)), np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match=rf"key {shape(2, 4, 5)} and value {shape(2, 3, 6)}"):
        an.multi_head_attention(p, x, np.zeros((2, 4, 5)), np.zeros((2, 3, 6)))
