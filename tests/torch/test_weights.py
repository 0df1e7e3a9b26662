"""need_weights=True without autograd on the CPU: the softmax overwrites the scores in
place (attnkit.torch._scores.attention_weights), so the weights are the one Tq x Tk
buffer. That rests on PyTorch's CPU softmax reading each row before writing it."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit.torch as at


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("Tk", [1, 7, 64, 1000, 3000])
def test_cpu_softmax_into_its_own_input_matches_a_fresh_buffer(dtype, Tk):
    g = torch.Generator().manual_seed(Tk)
    s = torch.randn(3, 5, Tk, generator=g, dtype=dtype) * 30
    s[0, 1, : Tk // 2] = -math.inf  # masked keys
    s[1, 2] = -math.inf  # a row with none: NaN, as in a fresh buffer
    s[2, 3, -1] = math.nan
    want = torch.softmax(s, dim=-1)
    got = torch.softmax(s, dim=-1, out=s)
    assert got.data_ptr() == s.data_ptr()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kw", [{}, {"valid_lens": torch.tensor([3, 40])},
                                {"causal": True}, {"valid_lens": torch.tensor([0, 40])}])
def test_weights_without_autograd_are_the_textbook_ones(kw):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        out, w = at.attention(q, k, v, need_weights=True, **kw)
        allowed = torch.ones(2, 1, 40, 40, dtype=torch.bool)
        if "valid_lens" in kw:
            allowed = allowed & (torch.arange(40) < kw["valid_lens"][:, None])[:, None, None]
        if "causal" in kw:
            allowed = allowed & torch.ones(40, 40, dtype=torch.bool).tril()
        s = (q @ k.mT / 4.0).masked_fill(~allowed, -math.inf)
        want = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: weights 0
    torch.testing.assert_close(w, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out, want @ v, rtol=1e-5, atol=1e-6)
    for x in (q, k, v):
        assert w.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
