"""additive_attention (Bahdanau) and multi_head_attention against explicit loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnkit.numpy as an

# --- additive ---------------------------------------------------------------------------


def additive_scores(q, k, w_q, w_k, w_v):
    """``a(q_i, k_j) = sum_h w_v[h] tanh(q_i . w_q[:, h] + k_j . w_k[:, h])``, by loops."""
    B, Tq, _ = q.shape
    Tk = k.shape[1]
    s = np.zeros((B, Tq, Tk))
    for b in range(B):
        for i in range(Tq):
            for j in range(Tk):
                s[b, i, j] = sum(
                    w_v[h] * math.tanh(q[b, i] @ w_q[:, h] + k[b, j] @ w_k[:, h])
                    for h in range(w_v.shape[0])
                )
    return s


ADDITIVE_CASES = {
    "none": {},
    "valid_lens-1d": {"valid_lens": np.array([0, 3])},
    "valid_lens-2d": {"valid_lens": np.array([[1, 4, 0], [5, 2, 3]])},
    "causal": {"causal": True},
    "mask+window": {"mask": np.array([[True, False, True, True, True]] * 3),
                    "window": (1, None)},
    "bias": {"bias": np.linspace(-1, 1, 15).reshape(3, 5)},
}


@pytest.mark.parametrize("case", ADDITIVE_CASES.values(), ids=ADDITIVE_CASES.keys())
@pytest.mark.parametrize("widths", [(3, 6, 4, 2), (1, 7, 5, 1)], ids=["Dq3-Dk6", "Dq1-Dk7"])
def test_additive_attention_matches_loops(ref, unchanged, case, widths):
    Dq, Dk, hidden, Dv = widths
    rng = np.random.default_rng(20)
    q = rng.standard_normal((2, 3, Dq))
    k = rng.standard_normal((2, 5, Dk))
    v = rng.standard_normal((2, 5, Dv))
    w_q, w_k, w_v = (
        rng.standard_normal((Dq, hidden)), rng.standard_normal((Dk, hidden)),
        rng.standard_normal(hidden),
    )
    arrays = [q, k, v, w_q, w_k, w_v] + [a for a in case.values() if isinstance(a, np.ndarray)]
    with unchanged(*arrays):
        out, w = an.additive_attention(q, k, v, w_q, w_k, w_v, **case)
    scores = additive_scores(q, k, w_q, w_k, w_v)
    want_out, want_w, _ = ref.attention(q, k, v, scores=scores, **case)
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)


def test_additive_attention_d2l_example():
    # d2l's Bahdanau example: equal keys give equal weights over the valid prefix.
    q = np.random.default_rng(21).standard_normal((2, 1, 20))
    k = np.ones((2, 10, 2))
    v = np.tile(np.arange(40.0).reshape(1, 10, 4), (2, 1, 1))
    rng = np.random.default_rng(22)
    w_q, w_k = rng.standard_normal((20, 8)), rng.standard_normal((2, 8))
    w_v = rng.standard_normal(8)
    out, w = an.additive_attention(q, k, v, w_q, w_k, w_v, valid_lens=np.array([2, 6]))
    np.testing.assert_allclose(out, [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-12)


# --- multi-head -------------------------------------------------------------------------


def mha_loops(query, key, value, P, *, valid_lens=None, causal=False):
    """Per-head projections, attention, concat and output projection, one head at a time."""
    H, Hkv = P["w_q"].shape[0], P["w_k"].shape[0]
    B, Tq, _ = query.shape
    Tk = key.shape[1]
    Dv = P["w_v"].shape[2]
    heads = np.zeros((B, Tq, H * Dv))
    for h in range(H):
        g = h // (H // Hkv)
        qh = query @ P["w_q"][h] + (0 if P.get("b_q") is None else P["b_q"][h])
        kh = key @ P["w_k"][g] + (0 if P.get("b_k") is None else P["b_k"][g])
        vh = value @ P["w_v"][g] + (0 if P.get("b_v") is None else P["b_v"][g])
        scores = np.einsum("bid,bjd->bij", qh, kh) / math.sqrt(qh.shape[-1])
        keep = np.ones((B, Tq, Tk), dtype=bool)
        for b in range(B):
            for i in range(Tq):
                for j in range(Tk):
                    if valid_lens is not None and j >= valid_lens[b]:
                        keep[b, i, j] = False
                    if causal and j > i + Tk - Tq:
                        keep[b, i, j] = False
        for b in range(B):
            for i in range(Tq):
                w = np.where(keep[b, i], np.exp(scores[b, i] - scores[b, i][keep[b, i]].max(
                    initial=-np.inf)), 0.0) if keep[b, i].any() else np.zeros(Tk)
                w = w / w.sum() if w.sum() else w
                heads[b, i, h * Dv:(h + 1) * Dv] = w @ vh[b]
    y = heads @ P["w_o"]
    return y if P.get("b_o") is None else y + P["b_o"]


def draw_params(rng, H, Hkv, Eq, Ek, Ev, Dk, Dv, Eo, bias):
    P = {
        "w_q": rng.standard_normal((H, Eq, Dk)), "w_k": rng.standard_normal((Hkv, Ek, Dk)),
        "w_v": rng.standard_normal((Hkv, Ev, Dv)), "w_o": rng.standard_normal((H * Dv, Eo)),
    }
    if bias:
        P.update(b_q=rng.standard_normal((H, Dk)), b_k=rng.standard_normal((Hkv, Dk)),
                 b_v=rng.standard_normal((Hkv, Dv)), b_o=rng.standard_normal(Eo))
    return P


def flatten_by_columns(P):
    """The flat layout written out by hand: column ``h*D + d`` of w_x is head h, dim d."""
    flat = {}
    for name in ("w_q", "w_k", "w_v"):
        w = P[name]
        heads, E, D = w.shape
        f = np.zeros((E, heads * D))
        for h in range(heads):
            for d in range(D):
                f[:, h * D + d] = w[h, :, d]
        flat[name] = f
    for name in ("b_q", "b_k", "b_v"):
        if name in P:
            flat[name] = np.concatenate(list(P[name]))
    flat["w_o"] = P["w_o"]
    if "b_o" in P:
        flat["b_o"] = P["b_o"]
    return flat


# (H, Hkv, Eq, Ek, Ev, Dk, Dv, Eo, Tq, Tk)
MHA_CASES = {
    "self": (4, 4, 8, 8, 8, 2, 2, 8, 5, 5),
    "E-not-multiple-of-H": (3, 3, 10, 10, 10, 4, 5, 10, 4, 4),
    "cross-kdim-vdim": (2, 2, 6, 5, 9, 3, 4, 7, 3, 8),
    "GQA": (4, 2, 8, 8, 8, 3, 2, 8, 6, 6),
    "MQA-Tq=1": (4, 1, 8, 6, 6, 3, 3, 5, 1, 7),
}


@pytest.mark.parametrize("dims", MHA_CASES.values(), ids=MHA_CASES.keys())
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("masking", ["none", "valid_lens", "causal"])
def test_multi_head_attention_matches_loops(unchanged, dims, bias, masking):
    H, Hkv, Eq, Ek, Ev, Dk, Dv, Eo, Tq, Tk = dims
    rng = np.random.default_rng(30)
    P = draw_params(rng, H, Hkv, Eq, Ek, Ev, Dk, Dv, Eo, bias)
    query = rng.standard_normal((2, Tq, Eq))
    key = rng.standard_normal((2, Tk, Ek))
    value = rng.standard_normal((2, Tk, Ev))
    kw = {}
    if masking == "valid_lens":
        kw["valid_lens"] = np.array([Tk, 1])
    if masking == "causal":
        kw["causal"] = True
    params = an.MultiHeadParams(**P)
    flat = an.MultiHeadParams.from_flat(**flatten_by_columns(P), num_heads=H, num_kv_heads=Hkv)
    with unchanged(query, key, value, *P.values()):
        out, w = an.multi_head_attention(params, query, key, value, **kw)
        out_flat, w_flat = an.multi_head_attention(flat, query, key, value, **kw)
    assert out.shape == (2, Tq, Eo) and w.shape == (2, H, Tq, Tk)
    np.testing.assert_allclose(out, mha_loops(query, key, value, P, **kw), rtol=1e-10, atol=1e-10)
    # The two layouts hold the same numbers, so the results are identical.
    np.testing.assert_array_equal(out_flat, out)
    np.testing.assert_array_equal(w_flat, w)


def test_self_attention_defaults_key_and_value_to_query():
    rng = np.random.default_rng(31)
    P = an.MultiHeadParams(**draw_params(rng, 2, 2, 4, 4, 4, 3, 3, 4, True))
    x = rng.standard_normal((2, 5, 4))
    a = an.multi_head_attention(P, x)
    b = an.multi_head_attention(P, x, x, x)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("bias", [False, True])
def test_to_flat_round_trip(bias):
    rng = np.random.default_rng(32)
    P = draw_params(rng, 4, 2, 7, 5, 6, 3, 2, 9, bias)
    params = an.MultiHeadParams(**P)
    flat = params.to_flat()
    for name, f in flatten_by_columns(P).items():
        np.testing.assert_array_equal(flat[name], f, err_msg=name)
    back = an.MultiHeadParams.from_flat(**flat, num_heads=4, num_kv_heads=2)
    for name, a in params.items():
        np.testing.assert_array_equal(getattr(back, name), a, err_msg=name)
    assert {n for n, _ in back.items()} == set(P)


def test_init_explicit_head_dim_allows_any_embed_dim():
    p = an.MultiHeadParams.init(10, 3, head_dim=4, v_head_dim=5, kdim=6, vdim=7, out_dim=9,
                                num_kv_heads=1, rng=np.random.default_rng(0))
    shapes = {n: a.shape for n, a in p.items()}
    assert shapes == {"w_q": (3, 10, 4), "w_k": (1, 6, 4), "w_v": (1, 7, 5), "w_o": (15, 9),
                      "b_q": (3, 4), "b_k": (1, 4), "b_v": (1, 5), "b_o": (9,)}
    out, _ = an.multi_head_attention(p, np.ones((1, 2, 10)), np.ones((1, 3, 6)), np.ones((1, 3, 7)))
    assert out.shape == (1, 2, 9) and np.all(np.isfinite(out))
    with pytest.raises(ValueError, match=r"embed_dim=10 is not a multiple of num_heads=3"):
        an.MultiHeadParams.init(10, 3)


@pytest.mark.parametrize("heads, kv_heads", [(0, None), (3, 2), (2, 0), (2, -1)])
def test_init_rejects_head_counts_by_name(heads, kv_heads):
    """The same rule and message as attnkit.torch.MultiHeadAttention (one helper)."""
    shown = heads if kv_heads is None else kv_heads
    with pytest.raises(ValueError, match=rf"num_heads={heads} must be a positive multiple "
                                         rf"of num_kv_heads={shown}"):
        an.MultiHeadParams.init(12, heads, num_kv_heads=kv_heads)


def test_mha_float32_stays_float32():
    P = an.MultiHeadParams.init(8, 2, rng=np.random.default_rng(0), dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    out, w = an.multi_head_attention(P, x)
    assert out.dtype == np.float32 and w.dtype == np.float32
    ref, _ = an.multi_head_attention(P.map(lambda a: a.astype(np.float64)), x.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
