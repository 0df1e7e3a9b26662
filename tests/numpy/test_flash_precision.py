"""NumPy flash attention in float32 at large logits (issue 16): the DESIGN.md rule holds.

At logits ~1e4 a float32 number has a spacing of 1e-3. Before, the forward folded log2(e)
into the scores (rounding each at that magnitude) and the backward rebuilt
``P = exp(s - lse)`` from a float32 LSE: output 1.9e-3, dq 0.21 and dk 0.11 off where plain
float32 math was off by 3e-7, 7e-5 and 5e-5. Now the scores stay in natural units, the
backward gets the LSE in float64 (``lse_dtype``; ``vjp`` asks for it) and recomputes the
forward's scores bit for bit.

Baseline of the rule: the plain NumPy math path (``scaled_dot_product_attention``) in
float32, whose softmax subtracts the row max and so is exact on these inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.numpy.flash import flash_attention_backward
from attnkit.testing import (
    assert_close_by_rule,
    band_keep,
    large_logit_inputs,
    reference_attention,
)

FACTORS = {"out": 2, "lse": 2, "dq": 5, "dk": 3, "dv": 3}


def _plain32(q, k, v, d_out, **opts):
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    (out, _), back = an.vjp(an.scaled_dot_product_attention, *f32, **opts)
    dq, dk, dv = back(d_out.astype(np.float32))
    # The LSE of the float32 scores, as plain math forms it (G = 1 or grouped heads).
    G = q.shape[-3] // k.shape[-3]
    kk = np.repeat(f32[1], G, axis=-3)
    s = np.matmul(f32[0], np.swapaxes(kk, -1, -2)) * np.float32(0.125)
    keep = band_keep(q.shape[-2], k.shape[-2], opts.get("causal", False), opts.get("window"))
    lse = an.logsumexp(np.where(keep, s, -np.inf), axis=-1)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _judge(got, q, k, v, d_out, **opts):
    ref = reference_attention(q, k, v, d_out=d_out, **opts)
    base = _plain32(q, k, v, d_out, **opts)
    for name, factor in FACTORS.items():
        if name in got:
            assert_close_by_rule(got[name], getattr(ref, name), base[name], factor=factor,
                                 name=name)


CASES = {
    "logits_1e4": dict(shape=dict(Tq=16, Tk=45), opts={}),
    "logits_1e4_causal": dict(shape=dict(Tq=45, Tk=45), opts=dict(causal=True)),
    "logits_1e4_gqa_window": dict(shape=dict(H=4, Hkv=2, Tq=20, Tk=37),
                                  opts=dict(window=(9, 3))),
    "logits_-1e4": dict(shape=dict(Tq=16, Tk=45, logit=-1e4), opts={}),
    "logits_1e5": dict(shape=dict(Tq=8, Tk=30, logit=1e5), opts={}),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_vjp_of_flash_float32_follows_the_rule_at_large_logits(case):
    q, k, v, d_out = large_logit_inputs(**case["shape"])
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    (out, lse), back = an.vjp(an.flash_attention, *f32, return_lse=True, block_q=8,
                              block_k=16, **case["opts"])
    dq, dk, dv = back(d_out.astype(np.float32))
    assert lse.dtype == np.float32 and dq.dtype == np.float32
    _judge(dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv), q, k, v, d_out, **case["opts"])


@pytest.mark.parametrize("causal", [False, True])
def test_public_forward_backward_pair_with_a_float64_lse(causal):
    q, k, v, d_out = large_logit_inputs(Tq=24, Tk=24, seed=3)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    out, lse = an.flash_attention(*f32, causal=causal, return_lse=True, block_q=8, block_k=8,
                                  lse_dtype=np.float64)
    assert out.dtype == np.float32 and lse.dtype == np.float64
    grads = flash_attention_backward(d_out.astype(np.float32), *f32, out, lse, causal=causal,
                                     block_q=8, block_k=8)
    _judge(dict(out=out, dq=grads[0], dk=grads[1], dv=grads[2]), q, k, v, d_out,
           causal=causal)
    # The float64 LSE is the float32 row max plus log of the row sum, unrounded: within
    # float32's relative precision of the *sum*, not of the LSE's magnitude.
    ref = reference_attention(q, k, v, causal=causal)
    assert np.max(np.abs(lse - ref.lse)) < 1e-5


def test_float32_lse_default_is_correctly_rounded():
    q, k, v, _ = large_logit_inputs(Tq=12, Tk=40, seed=4)
    _, lse = an.flash_attention(*(x.astype(np.float32) for x in (q, k, v)), return_lse=True)
    ref = reference_attention(q, k, v).lse
    assert lse.dtype == np.float32
    # Half a unit in the last place of 1e4 (4.9e-4): the base-2 conversion added more.
    assert np.all(np.abs(lse - ref) <= 0.5 * np.spacing(np.float32(1e4)) * (1 + 1e-3))


def test_random_inputs_q_times_20_d59_follow_the_rule():
    # The audit's case: q scaled x20, head dim 59, Tk = 45 (logits ~ 60, not dyadic).
    g = np.random.default_rng(1)
    q = g.standard_normal((1, 2, 16, 59)) * 20
    k, v = g.standard_normal((1, 2, 45, 59)), g.standard_normal((1, 2, 45, 59))
    d_out = g.standard_normal((1, 2, 16, 59))
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    (out, lse), back = an.vjp(an.flash_attention, *f32, return_lse=True, block_q=8,
                              block_k=16)
    dq, dk, dv = back(d_out.astype(np.float32))
    _judge(dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv), q, k, v, d_out)


def test_masked_nan_stays_out_of_other_keys_gradients():
    # Window (1, 0): query i attends keys i - 1 and i. A NaN value at key 2 makes rows 2
    # and 3 NaN (their delta too); the keys they do not attend must get no NaN in dK from
    # 0 * nan, as in the float64 reference (only keys 1..3 are NaN there).
    g = np.random.default_rng(5)
    q, k, v = (g.standard_normal((1, 8, 4)) for _ in range(3))
    v[0, 2, 1] = np.nan
    d_out = g.standard_normal((1, 8, 4))
    opts = dict(window=(1, 0), block_q=4, block_k=4)
    out, lse = an.flash_attention(q, k, v, return_lse=True, **opts)
    dq, dk, dv = flash_attention_backward(d_out, q, k, v, out, lse, **opts)
    ref = reference_attention(q, k, v, window=(1, 0), d_out=d_out)
    assert np.isnan(ref.dk[0, :, 0]).tolist() == [False, True, True, True] + [False] * 4
    for got, want in ((out, ref.out), (dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = ~np.isnan(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scaled", ["q", "k"])
def test_rows_on_one_key_at_logits_1e4_follow_the_rule(scaled):
    # Issue 23's audit: random q and k, one of them times 1e4, so the logits are ~1e4 apart
    # and every row's softmax is a single key (P = 1 there, 0 elsewhere). Plain float32
    # math then has dS = 1 * (dP - rowsum(P * dP)) = 0 to the bit; a row term formed as
    # rowsum(dO * O) rounds differently by ~1e-7, and the large keys (queries) multiply
    # that into dQ (dK): 1e-2 off where plain math is exact.
    g = np.random.default_rng(0)
    q, k, v, d_out = (g.standard_normal((1, 2, 40, 64)).astype(np.float32).astype(np.float64)
                      for _ in range(4))
    if scaled == "q":
        q *= 1e4
    else:
        k *= 1e4
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    (out, lse), back = an.vjp(an.flash_attention, *f32, return_lse=True, block_q=16,
                              block_k=16)
    dq, dk, dv = back(d_out.astype(np.float32))
    _judge(dict(out=out, dq=dq, dk=dk, dv=dv), q, k, v, d_out)
