"""Calls that once gave wrong results or crashed on the torch paths (issue 11), each
against the float64 NumPy reference or the same call made the plain way."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import attnkit.numpy as an
import attnkit.torch as at

BACKENDS = ["auto", "sdpa", "math"]


def t64(x: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=requires_grad)


def npy(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


# -- need_weights ----------------------------------------------------------------------------


def _views() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q, k, v ``(1, 2, 5, 8)`` whose last dim is not contiguous."""
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, 5, 16, generator=g) for _ in range(3)]
    return {
        "strided": tuple(x[..., ::2] for x in base),
        "stride-0": tuple(x[..., :1].expand(1, 2, 5, 8) for x in base),
        "transposed": tuple(torch.randn(1, 2, 8, 5, generator=g).transpose(-1, -2)
                            for _ in range(3)),
    }


@pytest.mark.parametrize("layout", list(_views()))
@pytest.mark.parametrize("backend", BACKENDS)
def test_need_weights_on_views_matches_dense_inputs(layout, backend):
    """Non-contiguous q/k/v (a strided last dim, stride 0, transposed): the output with
    weights equals the output without, and both equal those of contiguous copies."""
    q, k, v = _views()[layout]
    dense = [x.contiguous() for x in (q, k, v)]
    out_w, w = at.attention(q, k, v, need_weights=True, causal=True, backend=backend)
    out, _ = at.attention(q, k, v, causal=True, backend=backend)
    ref, ref_w = at.attention(*dense, need_weights=True, causal=True, backend="math")
    torch.testing.assert_close(out_w, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)


def test_need_weights_with_zero_heads_returns_empty():
    """Zero heads once killed the process (SIGFPE in the CPU flash op): run in a child."""
    code = (
        "import torch, attnkit.torch as at\n"
        "for backend in ('auto', 'sdpa', 'math'):\n"
        "    q = torch.randn(1, 0, 5, 8, requires_grad=True)\n"
        "    out, w = at.attention(q, q, q, need_weights=True, causal=True, backend=backend)\n"
        "    assert out.shape == (1, 0, 5, 8) and w.shape == (1, 0, 5, 5)\n"
        "    out.sum().backward()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("logit_scale", [1.0, 30.0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_weights_are_normalised_in_float32(logit_scale, backend):
    """bfloat16/float16 weights: rows sum to 1 up to the rounding of the returned dtype (not
    1 +- 0.07, nor 1e22 at large logits), and match float64 weights."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 64, 64, generator=g) for _ in range(3))
    q = q * logit_scale
    for dtype in (torch.bfloat16, torch.float16):
        qh, kh, vh = q.to(dtype), k.to(dtype), v.to(dtype)
        _, ref_w = at.attention(qh.double(), kh.double(), vh.double(), need_weights=True)
        out, w = at.attention(qh, kh, vh, need_weights=True, backend=backend)
        assert w.dtype == dtype
        eps = torch.finfo(dtype).eps
        rows = w.double().sum(-1)
        assert (rows - 1).abs().max() < 64 * eps, (dtype, (rows - 1).abs().max())
        torch.testing.assert_close(w.double(), ref_w, rtol=0, atol=2 * eps)


# -- mask and bias ranks ----------------------------------------------------------------------


RANKS = {
    "0-D": (),
    "1-D": (7,),
    "2-D": (5, 7),
    "3-D": (4, 5, 7),
    "4-D": (2, 1, 5, 7),
}


@pytest.mark.parametrize("rank", list(RANKS))
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_masks_and_biases_of_every_broadcastable_rank(rank, need_weights, backend, rng):
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8)))
    shape = RANKS[rank]
    mask = rng.random(shape) > 0.3
    bias = rng.standard_normal(shape)
    for kw in ({"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
        ref, ref_w = an.scaled_dot_product_attention(q, k, v, **kw)
        tkw = {n: (torch.tensor(x) if n == "mask" else t64(x)) for n, x in kw.items()}
        out, w = at.attention(t64(q), t64(k), t64(v), need_weights=need_weights,
                              backend=backend, **tkw)
        np.testing.assert_allclose(npy(out), ref, rtol=1e-10, atol=1e-12)
        if need_weights:
            np.testing.assert_allclose(npy(w), ref_w, rtol=1e-10, atol=1e-12)


# -- empty sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("Tq, Tk", [(0, 7), (5, 0), (0, 0)])
def test_empty_lengths_keep_autograd(backend, Tq, Tk):
    """Tq = 0 or Tk = 0: output (..., Tq, Dv) of zeros that stays in the graph, so backward
    runs and gives zero gradients of the right shapes."""
    q = torch.randn(2, 4, Tq, 8, requires_grad=True)
    k = torch.randn(2, 2, Tk, 8, requires_grad=True)
    v = torch.randn(2, 2, Tk, 3, requires_grad=True)
    for kw in ({}, {"causal": True}, {"valid_lens": torch.tensor([0, Tk])}):
        out, w = at.attention(q, k, v, need_weights=True, backend=backend, **kw)
        assert out.shape == (2, 4, Tq, 3) and w.shape == (2, 4, Tq, Tk)
        assert out.requires_grad and torch.all(out == 0)
        gq, gk, gv = torch.autograd.grad(out.sum() + w.sum(), (q, k, v))
        assert gq.shape == q.shape and gk.shape == k.shape and gv.shape == v.shape
        assert not any(torch.any(g != 0) for g in (gq, gk, gv))


def test_additive_attention_with_no_keys():
    attn = at.AdditiveAttention(5, 4, 7)
    q = torch.randn(2, 3, 4, requires_grad=True)
    out = attn(q, torch.randn(2, 0, 5), torch.randn(2, 0, 6))
    assert out.shape == (2, 3, 6) and torch.all(out == 0) and out.requires_grad
    out.sum().backward()
    assert torch.all(q.grad == 0)
    w = attn.attention_weights
    assert w is not None and w.shape == (2, 3, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_head_dim_uses_the_default_scale(backend):
    """Dk = 0: every score is 0, so each query averages its allowed values (the default
    scale is defined as 1 there, not 1/0)."""
    q, k = torch.randn(2, 3, 4, 0), torch.randn(2, 3, 6, 0)
    v = torch.randn(2, 3, 6, 5)
    out, w = at.attention(q, k, v, need_weights=True, causal=True, backend=backend)
    ref, ref_w = an.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)


# -- dropout ----------------------------------------------------------------------------------


def test_dropout_p_applies_unless_training_is_false():
    """dropout_p means what it means in attnkit.numpy and SDPA: applied by default
    (``training`` defaults to True, as torch.nn.functional.dropout), off with training=False."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=g) for _ in range(3))
    plain, _ = at.attention(q, k, v)
    for backend in BACKENDS:
        dropped, _ = at.attention(q, k, v, dropout_p=0.5, backend=backend)
        assert not torch.allclose(dropped, plain), backend
        off, _ = at.attention(q, k, v, dropout_p=0.5, training=False, backend=backend)
        torch.testing.assert_close(off, plain)
    w_q, w_k, w_v = torch.randn(4, 5), torch.randn(4, 5), torch.randn(5)
    a, _ = at.additive_attention(q, k, v, w_q, w_k, w_v)
    b, _ = at.additive_attention(q, k, v, w_q, w_k, w_v, dropout_p=0.5)
    c, _ = at.additive_attention(q, k, v, w_q, w_k, w_v, dropout_p=0.5, training=False)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a, c)


# -- double backward --------------------------------------------------------------------------


def test_double_backward_works_on_math_and_names_it_elsewhere():
    """create_graph=True: the math path differentiates twice (gradgradcheck); the default
    path either does too or stops with a message naming backend='math' (never PyTorch's
    internal op name)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    vl = torch.tensor([9])
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: at.attention(q, k, v, causal=True, valid_lens=vl, backend="math")[0],
        (q, k, v))
    for backend in ("auto", "sdpa"):
        out, _ = at.attention(q, k, v, causal=True, backend=backend)
        try:
            (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
            gq.square().sum().backward()
        except RuntimeError as err:
            assert "backend='math'" in str(err), err
