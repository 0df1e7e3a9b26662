"""Properties of attention that hold for any input (hypothesis), on the math and SDPA paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.torch as at

shapes = st.tuples(
    st.integers(1, 2),  # B
    st.integers(1, 3),  # H
    st.integers(1, 9),  # Tq
    st.integers(1, 9),  # Tk
    st.integers(1, 5),  # D
)
PATHS = ["math", "sdpa"]


def _inputs(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    B, H, Tq, Tk, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64) * 3
    k = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    mask = torch.rand(B, 1, Tq, Tk, generator=g) > 0.4
    return q, k, v, mask


@pytest.mark.parametrize("backend", PATHS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_bool_mask_equals_minus_inf_bias(backend, shape, seed):
    q, k, v, mask = _inputs(shape, seed)
    bias = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    a, wa = at.attention(q, k, v, mask=mask, need_weights=True, backend=backend)
    b, wb = at.attention(q, k, v, bias=bias, need_weights=True, backend=backend)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(wa, wb, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", PATHS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_permuting_keys_with_values_and_mask_changes_nothing(backend, shape, seed):
    q, k, v, mask = _inputs(shape, seed)
    perm = torch.randperm(k.shape[-2], generator=torch.Generator().manual_seed(seed))
    a, _ = at.attention(q, k, v, mask=mask, backend=backend)
    b, _ = at.attention(q, k[..., perm, :], v[..., perm, :], mask=mask[..., perm],
                        backend=backend)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", PATHS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), causal=st.booleans())
def test_weights_sum_to_one_and_output_in_hull_of_attended_values(backend, shape, seed, causal):
    q, k, v, mask = _inputs(shape, seed)
    out, w = at.attention(q, k, v, mask=mask, causal=causal, need_weights=True,
                          backend=backend)
    keep = at.attention_mask(w.shape, mask=mask, causal=causal).expand(w.shape)
    assert torch.all(w[~keep] == 0)
    has_key = keep.any(-1)
    torch.testing.assert_close(w.sum(-1)[has_key], torch.ones_like(w.sum(-1)[has_key]))
    assert torch.all(out[~has_key] == 0)
    big = torch.tensor(float("inf"), dtype=v.dtype)
    vv = v[..., None, :, :].expand(*w.shape, v.shape[-1])  # (B, H, Tq, Tk, D)
    lo = torch.where(keep[..., None], vv, big).amin(-2)
    hi = torch.where(keep[..., None], vv, -big).amax(-2)
    inside = (out >= lo - 1e-12) & (out <= hi + 1e-12)
    assert torch.all(inside[has_key])
