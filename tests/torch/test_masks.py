"""Mask helpers and masked_softmax against the NumPy reference; conversions from the
True = ignore convention of nn.MultiheadAttention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit.numpy as an
import attnkit.torch as at


@pytest.mark.parametrize("Tq, Tk", [(1, 1), (4, 4), (2, 5), (5, 2), (7, 13)])
@pytest.mark.parametrize("left, right", [(None, 0), (0, 0), (2, 1), (None, 3), (1, None), (3, -1)])
def test_window_and_causal_masks_match_numpy(Tq, Tk, left, right):
    got = at.window_mask(Tq, Tk, left, right).numpy()
    np.testing.assert_array_equal(got, an.window_mask(Tq, Tk, left, right))
    np.testing.assert_array_equal(at.causal_mask(Tq, Tk).numpy(), an.causal_mask(Tq, Tk))


def test_causal_is_bottom_right():
    # Tq=2, Tk=4: the last query sees every key, the first all but the last.
    expected = [[True, True, True, False], [True, True, True, True]]
    assert at.causal_mask(2, 4).tolist() == expected


def test_sequence_mask_matches_numpy():
    for vl in (np.array([0, 3, 5]), np.array([[1, 2], [5, 0]])):
        got = at.sequence_mask(torch.tensor(vl), 5).numpy()
        np.testing.assert_array_equal(got, an.sequence_mask(vl, 5))


@pytest.mark.parametrize("valid_lens", [None, [2, 3], [[1, 0, 4], [4, 4, 2]]])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16], ids=str)
def test_masked_softmax_matches_numpy_and_leaves_input(rng, valid_lens, dtype):
    X = rng.standard_normal((2, 3, 4)) * 4
    Xt = torch.tensor(X, dtype=dtype)
    before = Xt.clone()
    vl = None if valid_lens is None else torch.tensor(valid_lens)
    got = at.masked_softmax(Xt, vl)
    ref = an.masked_softmax(X, None if valid_lens is None else np.array(valid_lens))
    assert got.dtype == dtype
    tol = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got.double().numpy(), ref, atol=tol)
    assert torch.equal(Xt, before)


def test_masked_softmax_zero_length_gives_zeros_not_uniform():
    w = at.masked_softmax(torch.randn(2, 2, 4), torch.tensor([0, 2]))
    assert torch.all(w[0] == 0)
    torch.testing.assert_close(w[1].sum(-1), torch.ones(2))


def test_masked_softmax_half_precision_large_scores_do_not_overflow():
    X = torch.tensor([[[60000.0, 65000.0, -65000.0]]], dtype=torch.float16)
    w = at.masked_softmax(X, torch.tensor([2]))
    assert not torch.isnan(w).any()
    assert w[0, 0, 1] == 1 and w[0, 0, 2] == 0


def test_masked_softmax_with_bool_mask():
    X = torch.randn(2, 3)
    m = torch.tensor([[True, False, True], [False, False, False]])
    w = at.masked_softmax(X, mask=m)
    assert w[0, 1] == 0 and torch.all(w[1] == 0)
    torch.testing.assert_close(w[0].sum(), torch.tensor(1.0))


def test_from_key_padding_mask_flips_and_broadcasts():
    kpm = torch.tensor([[False, False, True], [False, True, True]])  # True = ignore
    keep = at.from_key_padding_mask(kpm)
    assert keep.shape == (2, 1, 1, 3)
    assert keep[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(TypeError, match="bool"):
        at.from_key_padding_mask(kpm.float())


def test_from_attn_mask():
    m = torch.tensor([[False, True], [False, False]])  # True = NOT allowed
    assert at.from_attn_mask(m)["mask"].tolist() == [[True, False], [True, True]]
    f = torch.tensor([[0.0, float("-inf")], [0.0, 1.0]])
    assert at.from_attn_mask(f)["bias"] is f


def test_attention_mask_ands_constraints():
    keep = at.attention_mask((2, 1, 3, 4), causal=True, valid_lens=torch.tensor([2, 4]),
                             window=(1, None))
    ref = an.attention_mask((2, 1, 3, 4), causal=True, valid_lens=np.array([2, 4]),
                            window=(1, None))
    np.testing.assert_array_equal(np.broadcast_to(keep.numpy(), (2, 1, 3, 4)),
                                  np.broadcast_to(ref, (2, 1, 3, 4)))
    assert at.attention_mask((2, 3, 4)) is None


@pytest.mark.parametrize("vl, exc, pattern", [
    ([1, 6], ValueError, r"\[0, 5\]"),
    ([-1, 2], ValueError, r"\[0, 5\]"),
    ([1.5, 2.0], TypeError, "whole numbers"),
    ([True, False], TypeError, "integers"),
])
def test_sequence_mask_errors(vl, exc, pattern):
    with pytest.raises(exc, match=pattern):
        at.sequence_mask(torch.tensor(vl), 5)


def test_sequence_mask_accepts_integral_floats():
    assert at.sequence_mask(torch.tensor([2.0, 0.0]), 3).tolist() == [
        [True, True, False], [False, False, False]
    ]


def test_a_valid_lens_mask_names_lengths_out_of_range():
    from attnkit.torch import masks

    got = masks.valid_lens_mask(torch.tensor([2, 4]), (2, 3, 1, 4))
    assert got[0, 0, 0].tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="got min 1 and max 9"):
        masks.valid_lens_mask(torch.tensor([1, 9]), (2, 3, 1, 4))
