"""DotProductAttention, AdditiveAttention and MultiHeadAttention against attnkit.numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit.numpy as an
import attnkit.torch as at
from attnkit.torch.functional import additive_scores


def t64(x: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=requires_grad)


def npy(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


# -- DotProductAttention -------------------------------------------------------------------


def test_dot_product_d2l_example():
    """d2l's own example (seed 003): keys all ones, so weights are uniform over the valid
    prefix and the output is the mean of the first valid_len value rows."""
    keys = torch.ones(2, 10, 2)
    values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    queries = torch.randn(2, 1, 2)
    attn = at.DotProductAttention(dropout=0.5).eval()
    out = attn(queries, keys, values, torch.tensor([2, 6]))
    torch.testing.assert_close(out, torch.tensor([[[2.0, 3, 4, 5]], [[10.0, 11, 12, 13]]]))
    assert attn.attention_weights.shape == (2, 1, 10)
    torch.testing.assert_close(attn.attention_weights[0, 0, :2], torch.full((2,), 0.5))
    assert torch.all(attn.attention_weights[1, 0, 6:] == 0)


@pytest.mark.parametrize("valid_lens", [None, [3, 7], [[1, 2, 3, 4, 5], [7, 0, 7, 1, 2]]])
def test_dot_product_matches_numpy(rng, valid_lens):
    q, k, v = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 7, 6)), rng.standard_normal(
        (2, 7, 3)
    )
    vl = None if valid_lens is None else np.array(valid_lens)
    ref_out, ref_w = an.scaled_dot_product_attention(q, k, v, valid_lens=vl)
    attn = at.DotProductAttention(0.1).eval()
    out = attn(t64(q), t64(k), t64(v), None if vl is None else torch.tensor(vl))
    np.testing.assert_allclose(npy(out), ref_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(npy(attn.attention_weights), ref_w, rtol=1e-12, atol=1e-14)


def test_dot_product_rejects_batch_mismatch_instead_of_grouping_it():
    """(B, T, D) inputs have no head axis: queries of batch 4 against keys of batch 2 are
    an error (as d2l's bmm makes it), not grouped-query attention over the batch axis."""
    attn = at.DotProductAttention()
    with pytest.raises(ValueError, match=r"queries \(4, 3, 5\).*keys \(2, 6, 5\)"):
        attn(torch.randn(4, 3, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 5))
    with pytest.raises(ValueError, match=r"\(B, Tq, D\).*\(2, 1, 3, 5\)"):
        attn(torch.randn(2, 1, 3, 5), torch.randn(2, 1, 6, 5), torch.randn(2, 1, 6, 5))


def test_dot_product_dropout_in_train_only():
    attn = at.DotProductAttention(0.5)
    q, k, v = torch.randn(2, 16, 4), torch.randn(2, 16, 4), torch.ones(2, 16, 1)
    torch.manual_seed(0)
    out_train = attn.train()(q, k, v)
    out_eval = attn.eval()(q, k, v)
    torch.testing.assert_close(out_eval, torch.ones_like(out_eval))
    assert not torch.allclose(out_train, out_eval)


# -- AdditiveAttention ---------------------------------------------------------------------


def _additive_ref(attn: at.AdditiveAttention, q, k, v, vl):
    return an.additive_attention(
        q, k, v, npy(attn.W_q.weight.T), npy(attn.W_k.weight.T), npy(attn.w_v.weight[0]),
        valid_lens=vl,
    )


@pytest.mark.parametrize("valid_lens", [None, [2, 9], [[1, 0, 9], [9, 4, 2]]])
@pytest.mark.parametrize("max_chunk_elements", [1, 40, 1 << 22])
def test_additive_matches_numpy_in_any_chunking(rng, valid_lens, max_chunk_elements):
    q, k, v = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 9, 4)), rng.standard_normal(
        (2, 9, 3)
    )
    attn = at.AdditiveAttention(4, 5, 8, dropout=0.2, max_chunk_elements=max_chunk_elements,
                                dtype=torch.float64).eval()
    vl = None if valid_lens is None else np.array(valid_lens)
    out = attn(t64(q), t64(k), t64(v), None if vl is None else torch.tensor(vl))
    ref_out, ref_w = _additive_ref(attn, q, k, v, vl)
    np.testing.assert_allclose(npy(out), ref_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(npy(attn.attention_weights), ref_w, rtol=1e-12, atol=1e-14)


def test_additive_d2l_state_dict_names():
    attn = at.AdditiveAttention(2, 20, 8, 0.1)
    assert set(attn.state_dict()) == {"W_k.weight", "W_q.weight", "w_v.weight"}
    assert attn.W_k.weight.shape == (8, 2) and attn.w_v.weight.shape == (1, 8)


class _D2L10Scores(torch.nn.Module):
    """What fixes the parameters of d2l 1.0's AdditiveAttention(num_hiddens, dropout): three
    bias-free LazyLinears, materialised by a forward that calls W_q, then W_k, then w_v."""

    def __init__(self, num_hiddens: int) -> None:
        super().__init__()
        self.W_k = torch.nn.LazyLinear(num_hiddens, bias=False)
        self.W_q = torch.nn.LazyLinear(num_hiddens, bias=False)
        self.w_v = torch.nn.LazyLinear(1, bias=False)

    def forward(self, queries, keys):
        q, k = self.W_q(queries), self.W_k(keys)
        return self.w_v(torch.tanh(q[:, :, None] + k[:, None])).squeeze(-1)


@pytest.mark.parametrize("make", [lambda: at.AdditiveAttention(8, 0.1),
                                  lambda: at.AdditiveAttention(num_hiddens=8, dropout=0.1)])
def test_additive_d2l_1_0_signature_is_lazy_and_exact(rng, make):
    attn = make().double().eval()
    assert attn.dropout.p == 0.1
    assert isinstance(attn.W_q.weight, torch.nn.parameter.UninitializedParameter)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5), (2, 6, 4), (2, 6, 3)))
    vl = np.array([2, 6])
    out = attn(t64(q), t64(k), t64(v), torch.tensor(vl))
    assert type(attn.W_q) is torch.nn.Linear and attn.W_q.weight.shape == (8, 5)
    assert attn.W_k.weight.shape == (8, 4) and attn.w_v.weight.shape == (1, 8)
    ref_out, ref_w = _additive_ref(attn, q, k, v, vl)
    np.testing.assert_allclose(npy(out), ref_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(npy(attn.attention_weights), ref_w, rtol=1e-12, atol=1e-14)


def test_additive_d2l_1_0_same_seed_same_weights_and_state_dicts_load(rng):
    q, k = torch.randn(2, 3, 5), torch.randn(2, 6, 4)
    v = torch.randn(2, 6, 3)
    torch.manual_seed(0)
    d2l = _D2L10Scores(8)
    d2l(q, k)
    torch.manual_seed(0)
    ours = at.AdditiveAttention(8, 0.0)
    ours(q, k, v)
    for name, p in d2l.state_dict().items():  # same draws, in the same order
        assert torch.equal(ours.state_dict()[name], p), name
    fresh = at.AdditiveAttention(8, 0.0)
    fresh.load_state_dict(d2l.state_dict())  # into uninitialised lazy parameters
    old_form = at.AdditiveAttention(4, 5, 8, 0.0)  # d2l 0.17: (key_size, query_size, ...)
    old_form.load_state_dict(ours.state_dict())
    for m in (fresh, old_form):
        torch.testing.assert_close(m(q, k, v), ours(q, k, v), rtol=0, atol=0)
    scores = torch.log(ours.attention_weights)  # softmax is shift-invariant per row
    d2l_scores = d2l(q, k)
    torch.testing.assert_close(scores - scores[..., :1], d2l_scores - d2l_scores[..., :1])


@pytest.mark.parametrize("args,kwargs,error,pattern", [
    ((), {}, TypeError, "d2l 0.17's.*d2l 1.0's"),
    ((4, 5, 8, 0.1, 3), {}, TypeError, "d2l 0.17's"),
    ((8, 0.1), {"dropout": 0.2}, TypeError, "d2l 0.17's"),
    ((4, 0, 8), {}, ValueError, r"positive ints, got \[4, 0, 8\]"),
    ((8.0, 0.1), {}, ValueError, r"positive ints, got \[8.0\]"),
])
def test_additive_signature_errors(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        at.AdditiveAttention(*args, **kwargs)


def test_dot_product_d2l_0_17_and_1_0_construct_alike():
    for attn in (at.DotProductAttention(0.5), at.DotProductAttention(dropout=0.5)):
        assert attn.dropout.p == 0.5 and attn.state_dict() == {}
        attn.load_state_dict({})  # d2l's DotProductAttention has no parameters either


@pytest.mark.parametrize("chunk_size", [1, 2, 5])
def test_additive_scores_gradcheck_chunked(rng, chunk_size):
    qh = t64(rng.standard_normal((2, 3, 4)), requires_grad=True)
    kh = t64(rng.standard_normal((1, 5, 4)), requires_grad=True)  # broadcast batch
    w_v = t64(rng.standard_normal(4), requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: additive_scores(a, b, c, chunk_size=chunk_size), (qh, kh, w_v)
    )


def test_additive_module_gradcheck_chunked_with_masks(rng):
    attn = at.AdditiveAttention(3, 2, 4, max_chunk_elements=8, dtype=torch.float64)
    q = t64(rng.standard_normal((2, 3, 2)), requires_grad=True)
    k = t64(rng.standard_normal((2, 5, 3)), requires_grad=True)
    v = t64(rng.standard_normal((2, 5, 2)), requires_grad=True)
    params = [attn.W_q.weight, attn.W_k.weight, attn.w_v.weight]

    def fn(q, k, v, *ps):
        with torch.nn.utils.stateless._reparametrize_module(
            attn, dict(zip(("W_q.weight", "W_k.weight", "w_v.weight"), ps))
        ):
            return attn(q, k, v, torch.tensor([[3, 0, 5], [1, 2, 5]]))

    assert torch.autograd.gradcheck(fn, (q, k, v, *params))


def test_additive_never_materialises_full_features(rng):
    """With a budget of 4 keys' worth of features, nothing autograd keeps (or the forward
    allocates as a feature slab) is Tk/4 times as big as a chunk."""
    B, Tq, Tk, h = 2, 16, 64, 8
    budget = B * Tq * h * 4
    attn = at.AdditiveAttention(3, 3, h, max_chunk_elements=budget)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    q = torch.randn(B, Tq, 3, requires_grad=True)
    k, v = torch.randn(B, Tk, 3), torch.randn(B, Tk, 2)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attn(q, k, v)
    out.sum().backward()
    assert max(saved) < B * Tq * Tk * h / 4
    full = at.AdditiveAttention(3, 3, h, max_chunk_elements=B * Tq * Tk * h)
    full.load_state_dict(attn.state_dict())
    torch.testing.assert_close(full(q, k, v), out)


# -- MultiHeadAttention --------------------------------------------------------------------

CONFIGS = [
    {"embed_dim": 16, "num_heads": 4},
    {"embed_dim": 16, "num_heads": 4, "num_kv_heads": 2},
    {"embed_dim": 12, "num_heads": 6, "num_kv_heads": 1},
    {"embed_dim": 10, "num_heads": 3, "head_dim": 7, "v_head_dim": 5},  # E % H != 0
    {"embed_dim": 8, "num_heads": 2, "kdim": 6, "vdim": 5, "bias": False},
]

MHA_CONSTRAINTS = [
    {},
    {"causal": True},
    {"valid_lens": "1d"},
    {"valid_lens": "2d", "window": (2, 1)},
    {"mask": True, "bias": True},
]


def _mha_inputs(rng, cfg, Tq, Tk):
    E = cfg["embed_dim"]
    query = rng.standard_normal((2, Tq, E))
    key = value = None
    if "kdim" in cfg:
        key = rng.standard_normal((2, Tk, cfg["kdim"]))
        value = rng.standard_normal((2, Tk, cfg["vdim"]))
    return query, key, value


@pytest.mark.parametrize("constraints", MHA_CONSTRAINTS, ids=lambda c: "+".join(c) or "none")
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_mha_matches_numpy(rng, cfg, constraints):
    m = at.MultiHeadAttention(**cfg, dtype=torch.float64).eval()
    Tq = 5
    Tk = 7 if "kdim" in cfg else Tq
    query, key, value = _mha_inputs(rng, cfg, Tq, Tk)
    H = cfg["num_heads"]
    kw: dict = {}
    for name in constraints:
        if name == "causal":
            kw["causal"] = True
        elif name == "window":
            kw["window"] = constraints["window"]
        elif name == "valid_lens":
            shape = (2,) if constraints[name] == "1d" else (2, Tq)
            kw["valid_lens"] = rng.integers(0, Tk + 1, size=shape)
        elif name == "mask":
            kw["mask"] = rng.random((2, H, Tq, Tk)) > 0.3
        elif name == "bias":
            kw["bias"] = rng.standard_normal((1, H, Tq, Tk))
    ref_out, ref_w = an.multi_head_attention(m.to_numpy_params(), query, key, value, **kw)
    tkw = {n: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for n, v in kw.items()}
    out, w = m(t64(query), None if key is None else t64(key), None if value is None else
               t64(value), **tkw, need_weights=True, average_weights=False)
    np.testing.assert_allclose(npy(out), ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(npy(w), ref_w, rtol=1e-10, atol=1e-12)
    _, w_avg = m(t64(query), None if key is None else t64(key), None if value is None else
                 t64(value), **tkw, need_weights=True)
    np.testing.assert_allclose(npy(w_avg), ref_w.mean(axis=1), rtol=1e-10, atol=1e-12)


def test_mha_numpy_params_roundtrip(rng):
    params = an.MultiHeadParams.init(10, 3, num_kv_heads=1, head_dim=4, v_head_dim=6,
                                     kdim=7, vdim=5, rng=rng)
    m = at.MultiHeadAttention.from_numpy_params(params)
    back = m.to_numpy_params()
    for (name, a), (_, b) in zip(params.items(), back.items()):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_mha_gradcheck(rng, num_kv_heads):
    m = at.MultiHeadAttention(4, 2, num_kv_heads=num_kv_heads, head_dim=3,
                              dtype=torch.float64)
    x = t64(rng.standard_normal((2, 3, 4)), requires_grad=True)
    names = [n for n, _ in m.named_parameters()]

    def fn(x, *ps):
        with torch.nn.utils.stateless._reparametrize_module(m, dict(zip(names, ps))):
            out, w = m(x, causal=True, valid_lens=torch.tensor([1, 3]), need_weights=True)
        return out, w

    assert torch.autograd.gradcheck(fn, (x, *m.parameters()), fast_mode=True)


def test_mha_registers_every_parameter():
    m = at.MultiHeadAttention(8, 2, num_kv_heads=1, kdim=6, vdim=5)
    names = {n for n, _ in m.named_parameters()}
    expected = {f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                for w in ("weight", "bias")}
    assert names == expected
    assert m.k_proj.weight.shape == (4, 6) and m.v_proj.weight.shape == (4, 5)
    m64 = m.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in m64.parameters())


def test_mha_xavier_init_and_zero_bias():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(64, 4, num_kv_heads=2)
    for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert lin.weight.abs().max() <= bound
        assert lin.weight.abs().max() > 0.9 * bound  # uniform over the whole range
        torch.testing.assert_close(lin.weight.std().item(), bound / math.sqrt(3), rtol=0.1,
                                   atol=0)
        assert torch.all(lin.bias == 0)


def test_mha_factory_kwargs_and_half_precision_forward():
    m = at.MultiHeadAttention(16, 4, dtype=torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    out, w = m(x, valid_lens=torch.tensor([0, 5]), need_weights=True)
    assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    assert torch.all(w[0] == 0)


def test_mha_self_attention_defaults():
    m = at.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(m(x)[0], m(x, x, x)[0])
    torch.testing.assert_close(m(x, x)[0], m(x, x, x)[0])  # value defaults to key


@pytest.mark.parametrize("args, kwargs, pattern", [
    ((torch.randn(2, 3, 7),), {}, r"query must be \(B, T, 8\), got \(2, 3, 7\)"),
    ((torch.randn(2, 3, 8), torch.randn(2, 4, 8), torch.randn(2, 5, 8)), {}, "share Tk"),
    ((torch.randn(2, 3, 8),), {"mask": torch.ones(3, 2, 3, 3, dtype=torch.bool)},
     r"\(3, 2, 3, 3\).*\(2, 2, 3, 3\)"),
    ((torch.randn(2, 5, 8), torch.randn(2, 7, 8)), {"mask": torch.ones(5, 6, dtype=torch.bool)},
     r"mask of shape \(5, 6\) is not broadcastable to scores \(2, 2, 5, 7\)"),
])
def test_mha_errors_name_shapes(args, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        at.MultiHeadAttention(8, 2)(*args, **kwargs)


def test_mha_rejects_ambiguous_3d_masks():
    """(B, Tq, Tk) with B == H would broadcast B against the head axis without a word."""
    m = at.MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"mask\[:, None\]"):
        m(x, mask=torch.ones(2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bias must be \(Tq, Tk\)"):
        m(x, bias=torch.zeros(2, 3, 3))
    out, _ = m(x, mask=torch.ones(2, 3, 3, dtype=torch.bool)[:, None])
    assert out.shape == (2, 3, 8)


def test_mha_constructor_errors():
    with pytest.raises(ValueError, match="head_dim"):
        at.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        at.MultiHeadAttention(12, 4, num_kv_heads=3)


@pytest.mark.parametrize("shapes", [((2, 3, 8), (2, 4, 9), (2, 4, 5)),
                                    ((2, 3, 8), (2, 4, 8), (2, 5, 5))])
def test_dot_product_attention_errors_name_the_callers_shapes(shapes):
    """Bug (audit): the message named attention()'s (B, 1, T, D) views."""
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError) as err:
        at.DotProductAttention()(q, k, v)
    assert all(str(s) in str(err.value) for s in shapes), str(err.value)
    assert "(2, 1," not in str(err.value)
