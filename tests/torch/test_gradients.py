"""Gradients of every torch path against the NumPy reference's hand-written backward
(attnkit.numpy.vjp), in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit.numpy as an
import attnkit.torch as at
from attnkit.numpy.vjp import vjp

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = [(2, 4, 2, 7, 9, 5, 3), (1, 3, 1, 1, 17, 59, 7), (2, 2, 2, 13, 6, 7, 7)]
CONSTRAINTS = [
    {},
    {"causal": True},
    {"valid_lens": "1d", "window": (3, 1)},
    {"mask": True, "bias": True},
]


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("constraints", CONSTRAINTS, ids=lambda c: "+".join(c) or "none")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sdpa_gradients_match_numpy_backward(rng, shape, constraints, backend):
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    q, k, v = (rng.standard_normal(s) for s in ((B, H, Tq, Dk), (B, Hkv, Tk, Dk), (B, Hkv, Tk, Dv)))
    kw: dict = {}
    if "causal" in constraints:
        kw["causal"] = True
    if "window" in constraints:
        kw["window"] = constraints["window"]
    if "valid_lens" in constraints:
        kw["valid_lens"] = np.array([Tk, 0][:B]) if B > 1 else np.array([Tk // 2])
    if "mask" in constraints:
        kw["mask"] = rng.random((B, 1, Tq, Tk)) > 0.3
    if "bias" in constraints:
        kw["bias"] = rng.standard_normal((1, H, Tq, Tk))
    (ref_out, _), pullback = vjp(an.scaled_dot_product_attention, q, k, v, **kw)
    d_out = rng.standard_normal(ref_out.shape)
    ref = pullback(d_out)

    tq, tk, tv = _t(q), _t(k), _t(v)
    tkw = {n: (torch.from_numpy(x) if isinstance(x, np.ndarray) else x) for n, x in kw.items()}
    if "bias" in tkw:
        tkw["bias"] = tkw["bias"].clone().requires_grad_()
    out, _ = at.attention(tq, tk, tv, **tkw, backend=backend)
    out.backward(torch.from_numpy(d_out))
    for name, got, want in (("dq", tq.grad, ref[0]), ("dk", tk.grad, ref[1]),
                            ("dv", tv.grad, ref[2])):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-11, err_msg=name)
    if "bias" in tkw:
        np.testing.assert_allclose(tkw["bias"].grad.numpy(), ref.bias, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("valid_lens", [None, [2, 9]])
def test_additive_gradients_match_numpy_backward(rng, valid_lens):
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5), (2, 9, 4), (2, 9, 3)))
    w_q, w_k, w_v = (rng.standard_normal(s) for s in ((5, 8), (4, 8), (8,)))
    vl = None if valid_lens is None else np.array(valid_lens)
    (ref_out, _), pullback = vjp(an.additive_attention, q, k, v, w_q, w_k, w_v, valid_lens=vl)
    d_out = rng.standard_normal(ref_out.shape)
    ref = pullback(d_out)
    xs = [_t(x) for x in (q, k, v, w_q, w_k, w_v)]
    out, _ = at.additive_attention(*xs, valid_lens=None if vl is None else torch.tensor(vl),
                                   chunk_size=2)
    out.backward(torch.from_numpy(d_out))
    for i, (x, want) in enumerate(zip(xs, ref)):
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-9, atol=1e-11, err_msg=str(i))


@pytest.mark.parametrize("cfg", [
    {"embed_dim": 12, "num_heads": 4, "num_kv_heads": 2},
    {"embed_dim": 8, "num_heads": 2, "kdim": 6, "vdim": 5, "head_dim": 3, "v_head_dim": 5},
])
def test_mha_parameter_gradients_match_numpy_backward(rng, cfg):
    m = at.MultiHeadAttention(**cfg, dtype=torch.float64)
    query = rng.standard_normal((2, 5, cfg["embed_dim"]))
    key = value = None
    if "kdim" in cfg:
        key = rng.standard_normal((2, 7, cfg["kdim"]))
        value = rng.standard_normal((2, 7, cfg["vdim"]))
    vl = np.array([5, 2]) if key is None else np.array([7, 3])
    args = (m.to_numpy_params(), query) + (() if key is None else (key, value))
    (ref_out, _), pullback = vjp(an.multi_head_attention, *args, valid_lens=vl,
                                 causal=key is None)
    d_out = rng.standard_normal(ref_out.shape)
    ref = pullback(d_out)
    tquery = _t(query)
    tkey = None if key is None else _t(key)
    tvalue = None if value is None else _t(value)
    out, _ = m(tquery, tkey, tvalue, valid_lens=torch.tensor(vl), causal=key is None)
    np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=1e-10, atol=1e-12)
    out.backward(torch.from_numpy(d_out))
    np.testing.assert_allclose(tquery.grad.numpy(), ref[1], rtol=1e-9, atol=1e-11)
    if key is not None:
        np.testing.assert_allclose(tkey.grad.numpy(), ref[2], rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(tvalue.grad.numpy(), ref[3], rtol=1e-9, atol=1e-11)
    d_params = ref[0].to_flat()
    for lin, w, b in ((m.q_proj, "w_q", "b_q"), (m.k_proj, "w_k", "b_k"),
                      (m.v_proj, "w_v", "b_v"), (m.out_proj, "w_o", "b_o")):
        np.testing.assert_allclose(lin.weight.grad.numpy().T, d_params[w], rtol=1e-9,
                                   atol=1e-11, err_msg=w)
        np.testing.assert_allclose(lin.bias.grad.numpy(), d_params[b], rtol=1e-9,
                                   atol=1e-11, err_msg=b)
