"""The Triton kernels in float32 at the numerical edges (issue 16), under the DESIGN.md rule.

- Logits ~1e4 (``attnkit.testing.large_logit_inputs``: exact in float32, so plain float32
  math is exact up to O(1) rounding). Before: the scores were rounded at their magnitude in
  base 2 and the backward rebuilt P from a float32 LSE: out 2.2e-4, dk 8.9e-2 against 3e-7
  and 5e-5 for plain float32.
- The audit's random case, q scaled x20 with head dim 59 and Tk = 45: dk 1.6e-4 against a
  bound of 9.4e-5 (the dK/dV kernel formed k @ q^T, which the interpreter's BLAS sums in
  another order than the forward's q @ k^T).
- Softcap: tanh as ``1 - 2/(e^{2x} + 1)`` cancelled for small x: output 3.9e-4 off at
  softcap 1e4 against 4.2e-7.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from attnkit.testing import assert_close_by_rule, large_logit_inputs, reference_attention
from attnkit.triton._kernels import _tanh

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
FACTORS = (("out", 2), ("lse", 2), ("dq", 5), ("dk", 3), ("dv", 3))


def _run(fn, q, k, v, dout, opts):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, lse = fn(q, k, v, opts)
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _judge(arrays, opts, reference, at):
    q, k, v, dout = (torch.as_tensor(np.ascontiguousarray(x)) for x in arrays)
    to = dict(device=DEVICE, dtype=torch.float32)
    q32, k32, v32, do32 = (x.to(**to) for x in (q, k, v, dout))

    def kernel(q, k, v, o):
        return at.flash_attention(q, k, v, **o, return_lse=True)

    got = _run(kernel, q32, k32, v32, do32, opts)
    base = _run(lambda q, k, v, o: reference.baseline(q, k, v, **o), q32, k32, v32, do32, opts)
    r = reference.float64(q, k, v, dout=dout, **opts)
    ref = (r.out, r.lse, r.dq, r.dk, r.dv)
    for (name, factor), a, want, b in zip(FACTORS, got, ref, base):
        assert_close_by_rule(a, want, b, factor=factor, name=name)


LARGE = {
    "plain": (dict(Tq=16, Tk=45), {}),
    "causal": (dict(Tq=45, Tk=45), dict(causal=True)),
    "gqa_window": (dict(H=4, Hkv=2, Tq=20, Tk=37), dict(window=(9, 3))),
    "negative": (dict(Tq=16, Tk=33, logit=-1e4), dict(causal=True)),
    "softcap": (dict(Tq=17, Tk=33), dict(softcap=2e4)),
}


@triton.jit
def _tanh_kernel(X, T, S, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N, other=0.0)
    t, s = _tanh(x)
    tl.store(T + offs, t, mask=offs < N)
    tl.store(S + offs, s, mask=offs < N)


@pytest.mark.parametrize("shape, opts", list(LARGE.values()), ids=list(LARGE))
def test_float32_follows_the_rule_at_logits_1e4(shape, opts, reference, at):
    _judge(large_logit_inputs(**shape), opts, reference, at)


def test_random_q_times_20_head_dim_59(reference, at):
    g = np.random.default_rng(1)
    q = g.standard_normal((1, 2, 16, 59)) * 20
    k, v = g.standard_normal((1, 2, 45, 59)), g.standard_normal((1, 2, 45, 59))
    _judge((q, k, v, g.standard_normal((1, 2, 16, 59))), {}, reference, at)


@pytest.mark.parametrize("softcap", [1e2, 1e4, 1e6])
def test_softcap_is_accurate_when_it_barely_caps(softcap, reference, at):
    # s / softcap is tiny: tanh's argument is ~1e-4, where 1 - 2/(e^{2x} + 1) cancelled.
    g = np.random.default_rng(2)
    q, dout = g.standard_normal((1, 2, 16, 32)), g.standard_normal((1, 2, 16, 32))
    k, v = g.standard_normal((1, 2, 33, 32)), g.standard_normal((1, 2, 33, 32))
    _judge((q, k, v, dout), dict(softcap=softcap, causal=True), reference, at)


def test_tanh_and_its_derivative_to_a_few_ulps(at):
    """The kernels' tanh over |x| from 1e-30 to 50 (both signs): a few float32 ulps, and
    1 - tanh^2 to a few ulps of its own size, where 1 - t*t would cancel near saturation."""
    mags = np.concatenate([np.geomspace(1e-30, 50.0, 2000), np.linspace(0.2, 0.3, 101)])
    x = np.concatenate([mags, -mags, [0.0]]).astype(np.float32)
    xt = torch.from_numpy(x).to(DEVICE)
    t, s = torch.empty_like(xt), torch.empty_like(xt)
    _tanh_kernel[(triton.cdiv(x.size, 256),)](xt, t, s, x.size, BLOCK=256)
    x64 = x.astype(np.float64)
    want_t, want_s = np.tanh(x64), 1.0 / np.cosh(x64) ** 2
    ulp_t = np.spacing(np.abs(want_t).astype(np.float32)).astype(np.float64)
    ulp_s = np.spacing(want_s.astype(np.float32)).astype(np.float64)
    err_t = np.abs(t.cpu().numpy() - want_t) / np.maximum(ulp_t, np.finfo(np.float32).tiny)
    err_s = np.abs(s.cpu().numpy() - want_s) / np.maximum(ulp_s, np.finfo(np.float32).tiny)
    assert err_t.max() <= 4, f"tanh off by {err_t.max():.1f} ulp at x={x[err_t.argmax()]}"
    # exp's argument, 2|x| log2(e), is rounded to its own ulp: that many ulps of the result
    # at large |x| (1 - t*t is simply 0 there: t rounds to 1 from |x| = 9 on).
    budget = 8 + 2 * np.abs(x64) * np.log2(np.e) * 2.0**-23 / 2.0**-24
    worst = np.argmax(err_s / budget)
    assert np.all(err_s <= budget), f"1 - tanh^2 off by {err_s[worst]:.1f} ulp at x={x[worst]}"


def test_forward_lse_is_correctly_rounded_at_large_logits(at):
    q, k, v, _ = large_logit_inputs(Tq=16, Tk=45, seed=6)
    to = dict(device=DEVICE, dtype=torch.float32)
    _, lse = at.flash_attention_forward(*(torch.as_tensor(x).to(**to) for x in (q, k, v)))
    _, lse64 = at.flash_attention_forward(*(torch.as_tensor(x).to(**to) for x in (q, k, v)),
                                          lse_dtype=torch.float64)
    ref = reference_attention(q, k, v).lse
    half_ulp = 0.5 * float(np.spacing(np.float32(1e4)))
    assert np.max(np.abs(lse.cpu().double().numpy() - ref)) <= half_ulp * (1 + 1e-3)
    # hi + lo: the float32 row statistics, unrounded (1.6e-5 before, at logits ~60).
    assert np.max(np.abs(lse64.cpu().numpy() - ref)) < 2e-6
