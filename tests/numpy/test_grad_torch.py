"""The hand-written NumPy gradients against torch.autograd, in float64.

The torch references below are the plain math, written independently of attnkit's
backward (masks are built with attnkit's mask helper, whose meaning is tested elsewhere).
Fully masked rows are guarded the same way as in attnkit (weights 0), so torch's
gradients are defined there too.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.numpy import (
    MultiHeadParams,
    additive_attention,
    attention_mask,
    flash_attention,
    log_softmax,
    masked_softmax,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    vjp,
)

torch = pytest.importorskip("torch", reason="torch is not installed: the torch comparison needs it")

ATOL = 1e-12


def _t(x: np.ndarray, grad: bool = True):
    return torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=grad)


def _close(ours: np.ndarray, theirs, name: str) -> None:
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape, f"{name}: {ours.shape} != {theirs.shape}"
    err = np.max(np.abs(ours - theirs), initial=0.0)
    scale = max(1.0, np.max(np.abs(theirs), initial=0.0))
    assert err <= ATOL * scale, f"{name}: max error {err:.3e} vs torch"


def _torch_attend(scores, v, keep, groups: int):
    """softmax over allowed keys (empty rows -> 0), then weights @ v, GQA by repeat."""
    if keep is not None:
        keep_t = torch.as_tensor(np.broadcast_to(keep, scores.shape).copy())
        scores = scores.masked_fill(~keep_t, float("-inf"))
        empty = ~keep_t.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(empty, 0.0)  # finite, so softmax is defined ...
        w = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)  # ... and then zeroed
    else:
        w = torch.softmax(scores, dim=-1)
    return w @ v.repeat_interleave(groups, dim=-3)


def _torch_sdpa(q, k, v, *, keep, bias, scale):
    G = q.shape[-3] // k.shape[-3]
    scores = q @ k.repeat_interleave(G, dim=-3).transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias
    return _torch_attend(scores, v, keep, G)


# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "Tq=1": (2, 2, 2, 1, 5, 3, 3),
    "Tk=1": (2, 2, 2, 4, 1, 3, 3),
    "Tq<Tk": (1, 2, 2, 3, 7, 4, 4),
    "Tq>Tk": (2, 2, 2, 7, 3, 4, 4),
    "Dk!=Dv": (1, 2, 2, 4, 5, 3, 6),
    "GQA": (2, 4, 2, 5, 6, 3, 2),
}
MASKS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (1, 1)},
    "valid_lens": {"valid_lens": "lens"},
    "mask+bias": {"mask": "mask", "bias": "bias"},
    "all": {"causal": True, "window": (3, None), "valid_lens": "lens", "bias": "bias"},
}


def _resolve(spec: dict, B: int, H: int, Tq: int, Tk: int, rng) -> dict:
    opts = dict(spec)
    if opts.get("valid_lens") == "lens":
        opts["valid_lens"] = np.array([0, Tk, 1, 2][:B]) if B > 1 else np.array([Tk - 1])
    if opts.get("mask") == "mask":
        opts["mask"] = rng.random((B, 1, Tq, Tk)) < 0.6
    if opts.get("bias") == "bias":
        opts["bias"] = rng.standard_normal((H, Tq, Tk))
    return opts


@pytest.mark.parametrize("masks", list(MASKS.values()), ids=list(MASKS))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_sdpa_and_flash_gradients_match_torch(shape, masks) -> None:
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Tq, Dk))
    k = rng.standard_normal((B, Hkv, Tk, Dk))
    v = rng.standard_normal((B, Hkv, Tk, Dv))
    opts = _resolve(masks, B, H, Tq, Tk, rng)
    keep = attention_mask(
        (B, H, Tq, Tk), mask=opts.get("mask"), valid_lens=opts.get("valid_lens"),
        causal=opts.get("causal", False), window=opts.get("window"),
    )
    g = rng.standard_normal((B, H, Tq, Dv))

    (out, _), pullback = vjp(scaled_dot_product_attention, q, k, v, **opts)
    grads = pullback(g)
    tq, tk, tv = _t(q), _t(k), _t(v)
    tb = _t(opts["bias"]) if "bias" in opts else None
    t_out = _torch_sdpa(tq, tk, tv, keep=keep, bias=tb, scale=Dk**-0.5)
    t_out.backward(torch.tensor(g))
    _close(out, t_out, "out")
    for name, ours, theirs in zip("qkv", grads, (tq, tk, tv)):
        _close(ours, theirs.grad, f"d{name}")
    if tb is not None:
        _close(grads.bias, tb.grad, "dbias")

    if set(opts) <= {"causal", "window"}:  # flash takes only the band
        f_out, f_pullback = vjp(flash_attention, q, k, v, block_q=2, block_k=3, **opts)
        _close(f_out, t_out, "flash out")
        for name, ours, theirs in zip("qkv", f_pullback(g), (tq, tk, tv)):
            _close(ours, theirs.grad, f"flash d{name}")


@pytest.mark.parametrize("masks", ["plain", "valid_lens", "mask+bias", "all"])
def test_additive_gradients_match_torch(masks) -> None:
    rng = np.random.default_rng(1)
    B, Tq, Tk, Dq, Dk, Dv, h = 3, 4, 5, 3, 2, 6, 7
    arrays = [
        rng.standard_normal(s)
        for s in ((B, Tq, Dq), (B, Tk, Dk), (B, Tk, Dv), (Dq, h), (Dk, h), (h,))
    ]
    opts = _resolve(MASKS[masks], B, 1, Tq, Tk, rng)
    if "mask" in opts:
        opts["mask"] = opts["mask"][:, 0]
    if "bias" in opts:
        opts["bias"] = opts["bias"][0]
    keep = attention_mask(
        (B, Tq, Tk), mask=opts.get("mask"), valid_lens=opts.get("valid_lens"),
        causal=opts.get("causal", False), window=opts.get("window"),
    )
    g = rng.standard_normal((B, Tq, Dv))
    (out, _), pullback = vjp(additive_attention, *arrays, **opts)
    grads = pullback(g)

    tq, tk, tv, twq, twk, twv = (_t(a) for a in arrays)
    scores = torch.tanh((tq @ twq)[..., :, None, :] + (tk @ twk)[..., None, :, :]) @ twv
    tb = _t(opts["bias"]) if "bias" in opts else None
    if tb is not None:
        scores = scores + tb
    t_out = _torch_attend(scores, tv, keep, 1)
    t_out.backward(torch.tensor(g))
    _close(out, t_out, "out")
    for name, ours, theirs in zip(("q", "k", "v", "w_q", "w_k", "w_v"), grads,
                                  (tq, tk, tv, twq, twk, twv)):
        _close(ours, theirs.grad, f"d{name}")
    if tb is not None:
        _close(grads.bias, tb.grad, "dbias")


MHA = {  # (E, H, Hkv, Dk, Dv, kdim, vdim, Eo, bias, self-attention)
    "self": (8, 2, 2, 4, 4, None, None, None, True, True),
    "self-no-bias": (8, 2, 2, 4, 4, None, None, None, False, True),
    "cross": (6, 3, 3, 2, 5, 4, 7, 5, True, False),
    "gqa-cross": (6, 4, 2, 3, 2, 5, 3, 6, True, False),
    "mqa": (6, 4, 1, 3, 3, None, None, None, False, True),
}


@pytest.mark.parametrize("masks", ["plain", "causal", "valid_lens", "mask+bias"])
@pytest.mark.parametrize("layout", list(MHA.values()), ids=list(MHA))
def test_mha_gradients_match_torch(layout, masks) -> None:
    E, H, Hkv, Dk, Dv, kdim, vdim, Eo, has_bias, self_attn = layout
    rng = np.random.default_rng(2)
    params = MultiHeadParams.init(
        E, H, num_kv_heads=Hkv, head_dim=Dk, v_head_dim=Dv, kdim=kdim, vdim=vdim,
        out_dim=Eo, bias=has_bias, rng=rng,
    ).map(lambda a: a + 0.2 * rng.standard_normal(a.shape))
    B, Tq, Tk = 2, 4, 4 if self_attn else 6
    query = rng.standard_normal((B, Tq, E))
    key = None if self_attn else rng.standard_normal((B, Tk, kdim))
    value = None if self_attn else rng.standard_normal((B, Tk, vdim))
    opts = _resolve(MASKS[masks], B, H, Tq, Tk, rng)
    keep = attention_mask(
        (B, H, Tq, Tk), mask=opts.get("mask"), valid_lens=opts.get("valid_lens"),
        causal=opts.get("causal", False), window=opts.get("window"),
    )
    g = rng.standard_normal((B, Tq, params.out_dim))
    (out, _), pullback = vjp(multi_head_attention, params, query, key, value, **opts)
    d_params, d_query, d_key, d_value = pullback(g)

    tp = {name: _t(a) for name, a in params.items()}
    tq = _t(query)
    tk = tq if key is None else _t(key)
    tv = tk if value is None else _t(value)

    def proj(x, w, b):
        y = torch.einsum("bte,hed->bhtd", x, w)
        return y if b is None else y + b[:, None, :]

    q = proj(tq, tp["w_q"], tp.get("b_q"))
    k = proj(tk, tp["w_k"], tp.get("b_k"))
    v = proj(tv, tp["w_v"], tp.get("b_v"))
    tb = _t(opts["bias"]) if "bias" in opts else None
    heads = _torch_sdpa(q, k, v, keep=keep, bias=tb, scale=Dk**-0.5)
    t_out = heads.transpose(1, 2).reshape(B, Tq, H * Dv) @ tp["w_o"]
    if "b_o" in tp:
        t_out = t_out + tp["b_o"]
    t_out.backward(torch.tensor(g))

    _close(out, t_out, "out")
    assert {n for n, _ in d_params.items()} == set(tp)
    for name, ours in d_params.items():
        _close(ours, tp[name].grad, f"d{name}")
    _close(d_query, tq.grad, "d_query")
    if self_attn:
        assert d_key is None and d_value is None
    else:
        _close(d_key, tk.grad, "d_key")
        _close(d_value, tv.grad, "d_value")
    if tb is not None:
        _close(pullback(g).bias, tb.grad, "dbias")


def test_softmax_family_gradients_match_torch() -> None:
    rng = np.random.default_rng(3)
    x = 4.0 * rng.standard_normal((3, 4, 6))
    g = rng.standard_normal(x.shape)
    for ours_fn, torch_fn in ((softmax, torch.softmax), (log_softmax, torch.log_softmax)):
        for axis in (-1, 1):
            out, pullback = vjp(ours_fn, x, axis=axis)
            tx = _t(x)
            t_out = torch_fn(tx, dim=axis)
            t_out.backward(torch.tensor(g))
            _close(out, t_out, ours_fn.__name__)
            _close(pullback(g)[0], tx.grad, f"d {ours_fn.__name__}")

    lens = np.array([1, 6, 3])
    out, pullback = vjp(masked_softmax, x, lens)
    tx = _t(x)
    keep = torch.as_tensor(np.arange(6) < lens[:, None, None])
    t_out = torch.softmax(tx.masked_fill(~keep, float("-inf")), dim=-1)
    t_out.backward(torch.tensor(g))
    _close(out, t_out, "masked_softmax")
    _close(pullback(g)[0], tx.grad, "d masked_softmax")
