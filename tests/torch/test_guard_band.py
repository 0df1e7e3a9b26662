"""Under a band (causal, window) and without autograd, the guard forms its fix-up after the
kernel, in the cleaned values' own buffer (attnkit.torch._nonfinite.LaterFix). NaN and inf
a query may attend must still reach exactly that query's output features, nothing else,
and the caller's tensors must come back untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit.torch as at
from attnkit.testing import reference_attention


def _poisoned(G: int, Tq: int, Tk: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2 * G, Tq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, Tk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, Tk, 6, generator=g, dtype=torch.float64)
    v[0, 0, Tk - 3, 1] = float("nan")  # attended only by the last queries
    v[1, 1, Tk // 2, 4] = float("inf")
    v[1, 1, Tk // 2 + 1, 4] = float("-inf")  # +inf and -inf together: NaN
    v[0, 1, 2, 0] = float("inf")  # early: every later query in the band sees it
    k[1, 0, Tk - 2, 3] = float("nan")  # a NaN key spoils the rows that attend it
    return q, k, v


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("kw", [
    {"causal": True}, {"causal": "top_left"}, {"window": (3, 0)}, {"window": (None, 1)},
])
@pytest.mark.parametrize("Tq, Tk", [(12, 12), (5, 12)])
def test_band_guard_without_autograd_matches_the_reference(backend, G, kw, Tq, Tk):
    q, k, v = _poisoned(G, Tq, Tk)
    before = [x.clone() for x in (q, k, v)]
    with torch.no_grad():
        out, _ = at.attention(q, k, v, backend=backend, **kw)
    ref = reference_attention(q.numpy(), np.repeat(k.numpy(), G, axis=1),
                              np.repeat(v.numpy(), G, axis=1), **kw)
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(ref.out))
    np.testing.assert_array_equal(np.isinf(out.numpy()), np.isinf(ref.out))
    np.testing.assert_allclose(out.numpy(), ref.out, rtol=1e-10, atol=1e-12)
    for x, x0 in zip((q, k, v), before):  # nothing written into the caller's tensors
        torch.testing.assert_close(x, x0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (3, 0)}])
def test_weights_of_a_row_that_attends_a_nan_key_stay_0_where_masked(backend, grad, kw):
    """Bug: a query attending a NaN key got NaN weights at its masked keys too."""
    q, k, v = _poisoned(1, 12, 12)
    q.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out, w = at.attention(q, k, v, need_weights=True, backend=backend, **kw)
    ref = reference_attention(q.detach().numpy(), k.numpy(), v.numpy(), **kw)
    w = w.detach().numpy()
    np.testing.assert_array_equal(np.isnan(w), np.isnan(ref.weights))
    np.testing.assert_allclose(w, ref.weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.detach().numpy(), ref.out, rtol=1e-10, atol=1e-12)


def test_band_guard_without_autograd_compiles_whole():
    q, k, v = _poisoned(2, 12, 12)

    def fn(q, k, v):
        return at.attention(q, k, v, causal=True)[0], at.attention(q, k, v, window=(3, 0))[0]

    with torch.no_grad():
        want = fn(q, k, v)
        got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True)
