"""attnkit.torch.attention on its Triton path keeps NaN/inf in masked positions out, as
every other path does. On a GPU the path takes half-precision CUDA tensors; here the
dispatcher is told to take CPU float32 ones, and the kernels run under the interpreter.

The kernels mask scores by a select, so a masked key cannot leak into the forward, but
``p @ v`` with ``p = 0`` still reads ``0 * nan`` from a masked value, and the backward's
``dQ = dS K`` and ``dK = dS^T Q`` do the same with masked keys and empty queries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit.torch as at
import attnkit.torch.functional as functional
from attnkit.testing import reference_attention

pytest.importorskip("attnkit.triton")


@pytest.fixture
def via_triton(monkeypatch):
    """The dispatcher's answer for a CUDA half-precision call, for CPU float32 tensors."""
    monkeypatch.setattr(functional, "triton_reason", lambda *a, **k: None)


def _poisoned(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(1, 2, 16, 16, generator=g) for _ in range(4))
    v[0, 0, 9, 3] = math.nan  # a future value for rows 0-8 (causal)
    v[0, 1, 12, 5] = math.inf
    k[0, 1, 10, 2] = math.nan  # a future key for rows 0-9
    return q, k, v, dout


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (3, 0)},
                                {"segment_ids": torch.tensor([[0] * 11 + [1] * 5])}])
@pytest.mark.parametrize("grad", [False, True])
def test_triton_path_keeps_masked_nan_out(via_triton, kw, grad):
    q, k, v, dout = _poisoned()
    before = [x.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out, _ = at.attention(q, k, v, backend="triton", **kw)
    ref_kw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    ref = reference_attention(*(x.detach().double().numpy() for x in (q, k, v)),
                              d_out=dout.double().numpy(), **ref_kw)
    # The math path in float64: the reference's NaN pattern under a band; under segments
    # (a dense mask) a row that may attend a NaN/inf value gets it in every feature, as the
    # guard documents (attnkit/torch/_nonfinite.py).
    with torch.no_grad():
        want, _ = at.attention(*(x.detach().double() for x in (q, k, v)), backend="math", **kw)
    want, got = want.numpy(), out.detach().numpy()
    if "segment_ids" not in kw:
        np.testing.assert_array_equal(np.isnan(want), np.isnan(ref.out))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5)
    if grad:
        out.backward(dout)
        for name, x in zip(("dq", "dk", "dv"), (q, k, v)):
            leaked = np.isnan(x.grad.numpy()) & ~np.isnan(getattr(ref, name))
            assert not leaked.any(), f"{name}: NaN where the reference has none"
    for x, x0 in zip((q, k, v), before):  # nothing written into the caller's tensors
        torch.testing.assert_close(x.detach(), x0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (3, 0)}])
def test_triton_path_weights_stay_0_where_masked(via_triton, kw):
    """need_weights on the Triton path: weights from the kernel's LSE, 0 at masked keys
    whatever they held, NaN only where the math path has it."""
    q, k, v, _ = _poisoned()
    with torch.no_grad():
        out, w = at.attention(q, k, v, backend="triton", need_weights=True, **kw)
        want_out, want_w = at.attention(*(x.double() for x in (q, k, v)), backend="math",
                                        need_weights=True, **kw)
    for got, want in ((out, want_out), (w, want_w)):
        got, want = got.numpy(), want.numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5)
