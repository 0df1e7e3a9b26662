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


def _poisoned(G: int, Tq: int, Tk: int, seed: int = 0, Dv: int = 6):
    """Dv = 6 != Dk sends SDPA to its math kernel, Dv = 8 to the CPU flash kernel."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2 * G, Tq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, Tk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, Tk, Dv, generator=g, dtype=torch.float64)
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
@pytest.mark.parametrize("Dv", [6, 8])
def test_band_guard_without_autograd_matches_the_reference(backend, G, kw, Tq, Tk, Dv):
    q, k, v = _poisoned(G, Tq, Tk, Dv=Dv)
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
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (3, 0)},
                                {"valid_lens": torch.tensor([10, 11])}])
@pytest.mark.parametrize("Dv", [6, 8])
def test_weights_of_a_row_that_attends_a_nan_key_stay_0_where_masked(backend, grad, kw, Dv):
    """Bug: a query attending a NaN key got NaN weights at its masked keys too (under a
    band when its keys were cleaned; under a key mask, and on SDPA's flash kernel under
    is_causal, where they are read as they are, always)."""
    q, k, v = _poisoned(1, 12, 12, Dv=Dv)
    q.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out, w = at.attention(q, k, v, need_weights=True, backend=backend, **kw)
    ref = reference_attention(q.detach().numpy(), k.numpy(), v.numpy(), **{
        n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sdpa_cpu_flash_kernel_keeps_a_future_nan_key_from_earlier_queries(dtype):
    """What attnkit.torch._sdpa.cpu_flash_causal relies on to leave keys uncleaned under
    is_causal: PyTorch's CPU flash kernel writes -inf over future keys' scores. If an
    upgrade breaks this, keys must be cleaned on that path again."""
    from attnkit.torch._sdpa import cpu_flash_causal

    g = torch.Generator().manual_seed(0)
    T = 1100  # past the kernel's key blocks (up to 512) and query blocks
    q, k, v = (torch.randn(1, 1, T, 64, generator=g).to(dtype) for _ in range(3))
    assert cpu_flash_causal(q, k, v, 0.0)
    for j in (1, 31, 32, 63, 64, 200, 511, 512, 777, 1099):
        bad = k.clone()
        bad[0, 0, j, 5] = float("nan")
        out = torch.nn.functional.scaled_dot_product_attention(q, bad, v, is_causal=True)
        assert torch.isfinite(out[0, 0, :j]).all(), f"a NaN in key {j} reached earlier rows"
        assert torch.isnan(out[0, 0, j:]).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
def test_keys_go_uncleaned_only_where_the_flash_kernel_runs():
    from attnkit.torch._sdpa import cpu_flash_causal

    q = k = v = torch.zeros(1, 2, 4, 8)
    assert cpu_flash_causal(q, k, v, 0.0)
    assert not cpu_flash_causal(q, k, v, 0.1)  # dropout: the math kernel
    assert not cpu_flash_causal(q, k, v[..., :6], 0.0)  # Dv != Dk
    assert not cpu_flash_causal(q[0], k[0], v[0], 0.0)  # 3-D
    assert not cpu_flash_causal(q, k.mT.contiguous().mT, v, 0.0)  # strided last axis
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert not cpu_flash_causal(q, k, v, 0.0)
        # ... and then the keys are cleaned, as SDPA's math kernel needs
        q, k, v = _poisoned(1, 12, 12, Dv=8)
        with torch.no_grad():
            out, _ = at.attention(q, k, v, causal=True)
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
    ref = reference_attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(ref.out))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"causal": "top_left"},
                                {"sinks": True}])
@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("grad", [False, True])
def test_a_row_whose_every_score_is_nan_comes_out_nan(backend, dtype, kw, G, grad):
    """Bug: without an attn_mask, SDPA's CPU kernel (float32 and narrower) takes a row
    whose scores are all NaN for a fully masked one and returns 0: a query holding a NaN,
    and under is_causal a query whose keys j <= i all hold one. The reference gives NaN."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2 * G, 6, 8, generator=g)
    k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(2))
    q[0, 1, 3, 2] = float("nan")  # an attended query row
    k[0, 0, 0, 5] = float("nan")  # key 0: every row attends it (causal rows 0.. too)
    if "sinks" in kw:  # the sink's logit is finite, but a NaN query spoils it too
        kw = {"sinks": torch.randn(2 * G, generator=g)}
    q, k, v = (x.to(dtype).requires_grad_(grad) for x in (q, k, v))
    with torch.set_grad_enabled(grad):
        out, _ = at.attention(q, k, v, backend=backend, **kw)
    kk, vv = (np.repeat(x.detach().double().numpy(), G, axis=1) for x in (k, v))
    ref = reference_attention(q.detach().double().numpy(), kk, vv, **{
        n: (x.double().numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    np.testing.assert_array_equal(np.isnan(out.detach().float().numpy()), np.isnan(ref.out))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("kw", [{"valid_lens": torch.tensor([[1, 1, 0, 1, 1], [1, 0, 1, 1, 0]])},
                                {"window": (0, None)}])
def test_a_nan_key_reaches_every_row_that_may_attend_it_when_tq_exceeds_tk(backend, kw):
    """Bug: with no right edge (2-D valid_lens, a window open to the right) the last key a
    row may attend was computed as i + 2 Tk - Tq, short of Tk - 1 for the first rows once
    Tq > Tk + 1: those rows lost the NaN of a key they attend."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k[0, 1, 0, 6] = float("nan")
    v[1, 0, 1, 3] = float("inf")
    with torch.no_grad():
        out, _ = at.attention(q, k, v, backend=backend, **kw)
    ref = reference_attention(q.numpy(), k.numpy(), v.numpy(), **{
        n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(ref.out))
    np.testing.assert_array_equal(np.isinf(out.numpy()), np.isinf(ref.out))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (1, 0)},
                                {"valid_lens": torch.tensor([4, 6])},
                                {"mask": torch.tensor([[True, False] * 3])[:, None, None, :]}])
@pytest.mark.parametrize("G", [1, 2])
def test_a_nan_query_reaches_no_gradient_of_a_key_it_may_not_attend(backend, kw, G):
    """Bug: with autograd, a query holding a NaN was given to the kernel as it was, so
    dK = dS^T Q read 0 * nan at the keys masked for it, and dV through its NaN
    probabilities: NaN in gradients where the reference has none."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2 * G, 6, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(2))
    q[0, 0, 2, 4] = float("nan")  # attends keys 0..2 under causal: 3..5 are masked for it
    q[1, 1, 0, 1] = float("nan")
    dout = torch.randn(2, 2 * G, 6, 8, generator=g, dtype=torch.float64)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    out, _ = at.attention(q, k, v, backend=backend, **kw)
    out.backward(dout)
    kk, vv = (np.repeat(x.detach().numpy(), G, axis=1) for x in (k, v))
    ref = reference_attention(q.detach().numpy(), kk, vv, d_out=dout.numpy(), **{
        n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    np.testing.assert_array_equal(np.isnan(out.detach().numpy()), np.isnan(ref.out))
    for name, got in (("dk", k.grad), ("dv", v.grad)):
        want = getattr(ref, name).reshape(2, 2, G, 6, 8).sum(2)  # a group's heads summed
        extra = np.isnan(got.numpy()) & ~np.isnan(want)
        assert not extra.any(), f"{name}: NaN where the reference has none"
