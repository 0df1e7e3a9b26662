"""attnkit.torch.MultiheadAttention against the real torch.nn.MultiheadAttention with the
same weights: every constructor argument and every forward argument, alone and combined,
outputs, weights and every gradient (float64 to 1e-12; float32 by the DESIGN rule), torch's
is_causal hint read as torch reads it, checkpoints both ways, and attnkit's documented
differences (fully masked rows, pre-dropout weights)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch import nn

import attnkit.torch as at
from attnkit.testing import assert_close_by_rule

E, H, B, Tq, Tk = 8, 2, 3, 4, 5
F64 = torch.float64

# Constructor arguments, alone and combined (dropout in eval mode: inactive, still stored).
LAYERS = {
    "default": {},
    "no_bias": {"bias": False},
    "bias_kv": {"add_bias_kv": True},
    "zero_attn": {"add_zero_attn": True},
    "kdim_vdim": {"kdim": 3, "vdim": 7},
    "batch_first": {"batch_first": True},
    "all": {"bias": False, "add_bias_kv": True, "add_zero_attn": True, "kdim": 3, "vdim": 7,
            "batch_first": True, "dropout": 0.5},
}
# Masks in torch's polarity, alone and combined; "hint" = is_causal with its causal mask.
CALLS = ["none", "kpm_bool", "kpm_float", "bool_2d", "float_3d", "bool_3d+kpm_bool",
         "float_2d+kpm_bool", "hint", "hint+kpm_bool"]
# (need_weights, average_attn_weights)
WEIGHTS = {"averaged": (True, True), "per_head": (True, False), "no_weights": (False, True)}


def torch_pair(layer: dict, *, seed: int = 0, dtype: torch.dtype = F64):
    """A torch layer with non-zero biases, and attnkit's copy of it (both in eval mode)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H, dtype=dtype, **layer).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "bias" in name:  # zero at init: a dropped or misplaced bias would not show
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype))
    return ref, at.MultiheadAttention.from_torch(ref)


def masks(call: str, batched: bool, q_len: int, k_len: int, gen: torch.Generator) -> dict:
    """torch's forward kwargs for ``call``; every query keeps at least one key."""
    kpm = torch.zeros(B, k_len, dtype=torch.bool)
    kpm[1, 2:] = True
    kpm_float = torch.randn(B, k_len, generator=gen, dtype=F64)
    kpm_float[2, 3:] = float("-inf")
    bool_2d = torch.rand(q_len, k_len, generator=gen) > 0.6
    bool_2d[:, 0] = False
    float_2d = torch.randn(q_len, k_len, generator=gen, dtype=F64)
    bool_3d = torch.rand(B * H, q_len, k_len, generator=gen) > 0.6
    bool_3d[..., 0] = False
    float_3d = torch.randn(B * H, q_len, k_len, generator=gen, dtype=F64)
    top_left = torch.ones(q_len, k_len, dtype=torch.bool).triu(1)  # True = NOT allowed
    pick = {
        "none": {}, "kpm_bool": {"key_padding_mask": kpm},
        "kpm_float": {"key_padding_mask": kpm_float}, "bool_2d": {"attn_mask": bool_2d},
        "float_3d": {"attn_mask": float_3d},
        "bool_3d+kpm_bool": {"attn_mask": bool_3d, "key_padding_mask": kpm},
        "float_2d+kpm_bool": {"attn_mask": float_2d, "key_padding_mask": kpm},
        "hint": {"attn_mask": top_left, "is_causal": True},
        "hint+kpm_bool": {"attn_mask": top_left, "is_causal": True, "key_padding_mask": kpm},
    }[call]
    if not batched:  # the unbatched shapes: (Tk,) and (H, Tq, Tk)
        pick = {name: (m if name == "is_causal" else m[1] if name == "key_padding_mask"
                       else m[:H] if m.ndim == 3 else m) for name, m in pick.items()}
    return pick


def inputs(layer: dict, self_attention: bool, batched: bool, gen: torch.Generator):
    """query, key, value in the layer's layout (one tensor three times for self-attention)."""
    q_len, k_len = (Tq, Tq) if self_attention else (Tq, Tk)

    def make(T: int, width: int) -> torch.Tensor:
        x = torch.randn(B, T, width, generator=gen, dtype=F64)
        x = x if layer.get("batch_first") else x.transpose(0, 1).contiguous()
        return (x if batched else x[:, 0] if not layer.get("batch_first") else x[0]).detach()

    query = make(q_len, E).requires_grad_()
    if self_attention:
        return query, query, query, k_len
    key = make(k_len, layer.get("kdim") or E).requires_grad_()
    value = make(k_len, layer.get("vdim") or E).requires_grad_()
    return query, key, value, k_len


def run(m: nn.Module, q, k, v, kwargs: dict):
    """Output, weights and the gradients of every input and parameter."""
    out, w = m(q, k, v, **kwargs)
    gen = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum()
    if w is not None:
        loss = loss + (w * torch.randn(w.shape, generator=gen, dtype=w.dtype)).sum()
    leaves = list(dict.fromkeys([q, k, v])) + list(m.parameters())
    grads = torch.autograd.grad(loss, leaves)
    return out, w, grads


GRID = [
    pytest.param(layer, call, weights, inputs_, batched_,
                 id=f"{layer}-{call}-{weights}-{inputs_}-{batched_}")
    for layer, call, weights, inputs_, batched_ in itertools.product(
        LAYERS, CALLS, WEIGHTS, ["self", "cross"], ["batched", "unbatched"])
    if not (inputs_ == "self" and "kdim" in LAYERS[layer])
]


@pytest.mark.filterwarnings("ignore:Support for mismatched")  # torch on mixed mask dtypes
@pytest.mark.parametrize("layer,call,weights,inputs_,batched", GRID)
def test_matches_nn_multihead_attention(layer, call, weights, inputs_, batched):
    gen = torch.Generator().manual_seed(1)
    ref, ours = torch_pair(LAYERS[layer])
    batched = batched == "batched"
    q, k, v, k_len = inputs(LAYERS[layer], inputs_ == "self", batched, gen)
    need_weights, average = WEIGHTS[weights]
    kwargs = dict(masks(call, batched, Tq, k_len, gen), need_weights=need_weights,
                  average_attn_weights=average)
    ref_out, ref_w, ref_grads = run(ref, q, k, v, kwargs)
    out, w, grads = run(ours, q, k, v, kwargs)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    assert (w is None) == (ref_w is None) == (not need_weights)
    if need_weights:
        torch.testing.assert_close(w, ref_w, rtol=1e-12, atol=1e-12)
    names = ["query", "key", "value"][: len(grads) - len(list(ours.parameters()))]
    names += [n for n, _ in ours.named_parameters()]
    for name, g, ref_g in zip(names, grads, ref_grads):
        torch.testing.assert_close(g, ref_g, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("layer", ["default", "all"])
def test_float32_by_design_rule(layer):
    """float32 against float64 torch: at most 2x (outputs) / 5x (gradients) the error of
    torch's own float32 layer, plus 1e-5."""
    results = {}
    for name, dtype, cls in (("ref64", F64, None), ("torch32", torch.float32, None),
                             ("ours32", torch.float32, at.MultiheadAttention)):
        ref, _ = torch_pair(LAYERS[layer], dtype=dtype)
        m = ref if cls is None else cls.from_torch(ref)
        gen = torch.Generator().manual_seed(1)
        q, k, v, k_len = inputs(LAYERS[layer], False, True, gen)
        q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
        kwargs = masks("bool_3d+kpm_bool", True, Tq, k_len, gen)
        results[name] = run(m, q, k, v, kwargs)
    ref, base, ours = results["ref64"], results["torch32"], results["ours32"]
    assert_close_by_rule(ours[0], ref[0], base[0], factor=2, name="output")
    assert_close_by_rule(ours[1], ref[1], base[1], factor=2, name="weights")
    for i, (g, g_ref, g_base) in enumerate(zip(ours[2], ref[2], base[2])):
        assert_close_by_rule(g, g_ref, g_base, factor=5, name=f"gradient {i}")


# -- constructor, parameters, checkpoints -------------------------------------------------


@pytest.mark.parametrize("layer", list(LAYERS))
def test_constructor_parameters_and_init_are_torchs(layer):
    kw = dict(LAYERS[layer], device="cpu", dtype=F64)
    torch.manual_seed(3)
    ref = nn.MultiheadAttention(E, H, **kw)
    torch.manual_seed(3)
    ours = at.MultiheadAttention(E, H, **kw)
    assert isinstance(ours, nn.MultiheadAttention)
    for attr in ("embed_dim", "num_heads", "head_dim", "kdim", "vdim", "dropout",
                 "batch_first", "_qkv_same_embed_dim", "add_zero_attn", "training"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    sd, ref_sd = ours.state_dict(), ref.state_dict()
    assert list(sd) == list(ref_sd)
    for name in sd:  # same initialisation from the same seed, same dtype
        assert torch.equal(sd[name], ref_sd[name]) and sd[name].dtype == F64, name


def test_checkpoints_load_both_ways():
    ref, _ = torch_pair(LAYERS["all"])
    ours = at.MultiheadAttention(E, H, dtype=F64, **LAYERS["all"])
    ours.load_state_dict(ref.state_dict())  # strict: same keys, same shapes
    back = nn.MultiheadAttention(E, H, dtype=F64, **LAYERS["all"])
    back.load_state_dict(ours.state_dict())
    for name, p in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[name], p) and torch.equal(back.state_dict()[name], p)


def test_from_torch_copies_or_shares_and_draws_nothing():
    ref, _ = torch_pair(LAYERS["bias_kv"])
    ref.train()
    ref.out_proj.bias.requires_grad_(False)
    rng = torch.get_rng_state()
    copy = at.MultiheadAttention.from_torch(ref)
    shared = at.MultiheadAttention.from_torch(ref, share_parameters=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert copy.training and shared.training
    for (name, p), p_copy, p_shared in zip(ref.named_parameters(), copy.parameters(),
                                           shared.parameters()):
        assert p_shared is p, name
        assert p_copy is not p and torch.equal(p_copy, p), name
        assert p_copy.requires_grad == p.requires_grad, name
    with pytest.raises(TypeError, match="MultiheadAttention"):
        at.MultiheadAttention.from_torch(nn.Linear(2, 2))


# -- is_causal, dropout, fully masked rows -------------------------------------------------


def test_is_causal_needs_attn_mask_as_in_torch():
    ref, ours = torch_pair({})
    x = torch.randn(Tq, B, E, dtype=F64)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ref(x, x, x, is_causal=True, need_weights=False)
    with pytest.raises(ValueError, match="needs attn_mask"):
        ours(x, x, x, is_causal=True, need_weights=False)


@pytest.mark.parametrize("need_weights", [False, True])
def test_is_causal_hint_is_read_as_torch_reads_it(need_weights):
    """Given a mask that is NOT causal, torch trusts the hint (top-left causal, mask unread)
    exactly when there is no key_padding_mask and need_weights=False; so does attnkit."""
    ref, ours = torch_pair({})
    q, mem = torch.randn(Tq, B, E, dtype=F64), torch.randn(Tk, B, E, dtype=F64)
    wrong = torch.zeros(Tq, Tk, dtype=torch.bool)  # allows everything
    kw = dict(attn_mask=wrong, is_causal=True, need_weights=need_weights)
    out, ref_out = ours(q, mem, mem, **kw)[0], ref(q, mem, mem, **kw)[0]
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    unmasked = ours(q, mem, mem)[0]
    top_left = ours(q, mem, mem, attn_mask=torch.ones(Tq, Tk, dtype=torch.bool).triu(1))[0]
    expected = unmasked if need_weights else top_left
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(top_left, unmasked)


def test_fully_masked_rows_give_zero_not_nan():
    """A documented difference: torch returns NaN for a query with no allowed key."""
    ref, ours = torch_pair({})
    x = torch.randn(Tq, B, E, dtype=F64, requires_grad=True)
    mask = torch.zeros(Tq, Tq, dtype=torch.bool)
    mask[1] = True  # query 1 may attend nothing
    ref_out, ref_w = ref(x, x, x, attn_mask=mask)
    out, w = ours(x, x, x, attn_mask=mask)
    assert torch.isnan(ref_out[1]).all()
    torch.testing.assert_close(out[1], ours.out_proj.bias.expand(B, E))  # attention output 0
    assert torch.all(w[:, 1] == 0)
    keep = [0, 2, 3]
    torch.testing.assert_close(out[keep], ref_out[keep], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w[:, keep], ref_w[:, keep], rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_dropout_in_training_only_and_weights_before_dropout():
    ref, ours = torch_pair({"dropout": 0.5})
    q, mem = torch.randn(Tq, B, E, dtype=F64), torch.randn(Tk, B, E, dtype=F64)
    eval_out, eval_w = ours(q, mem, mem)
    torch.testing.assert_close(eval_out, ref(q, mem, mem)[0], rtol=1e-12, atol=1e-12)
    ours.train()
    torch.manual_seed(0)
    runs = [ours(q, mem, mem) for _ in range(400)]
    assert not torch.allclose(runs[0][0], runs[1][0])  # dropout is on
    for _, w in runs[:5]:  # documented difference: the weights before dropout
        torch.testing.assert_close(w, eval_w, rtol=1e-12, atol=1e-12)
    mean = torch.stack([out for out, _ in runs]).mean(dim=0)  # E[dropout(w)] = w
    torch.testing.assert_close(mean, eval_out, rtol=0, atol=0.15)


# -- errors, cache, NaN ------------------------------------------------------------------


@pytest.mark.parametrize("args,kwargs,error,pattern", [
    ((torch.randn(2, 3, 4, E),) * 3, {}, ValueError, r"query \(2, 3, 4, 8\)"),
    ((torch.randn(Tq, B, E), torch.randn(Tk, B, E), torch.randn(Tk + 1, B, E)), {},
     ValueError, r"one Tk.*value \(6, 3, 8\)"),
    ((torch.randn(Tq, B, E),) * 3, {"key_padding_mask": torch.zeros(B, Tk, dtype=torch.bool)},
     ValueError, r"key_padding_mask must be \(B, Tk\) = \(3, 4\), got \(3, 5\)"),
    ((torch.randn(Tq, B, E),) * 3, {"attn_mask": torch.zeros(B, Tq, Tq)}, ValueError,
     r"\(B\*H, Tq, Tk\) = \(6, 4, 4\), got \(3, 4, 4\)"),
    ((torch.randn(Tq, B, E),) * 3, {"attn_mask": torch.zeros(Tq, Tq, dtype=torch.int64)},
     TypeError, "attn_mask must be bool.*int64"),
    ((torch.randn(Tq, E), torch.randn(Tk, E), torch.randn(Tk, B, E)), {}, ValueError,
     "all 3-D.*or all 2-D"),
])
def test_bad_shapes_raise_naming_them(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        at.MultiheadAttention(E, H)(*args, **kwargs)


def test_kv_cache_decoding_equals_one_causal_forward():
    _, ours = torch_pair({"batch_first": True, "add_bias_kv": True})
    x = torch.randn(B, 7, E, dtype=F64)
    full = ours(x, x, x, attn_mask=torch.ones(7, 7, dtype=torch.bool).triu(1))[0]
    cache = ours.init_cache(B, 8)
    prompt = x[:, :4]
    steps = [ours(prompt, prompt, prompt, need_weights=False, cache=cache,
                  attn_mask=torch.ones(4, 4, dtype=torch.bool).triu(1), is_causal=True)[0]]
    for t in range(4, 7):
        x_t = x[:, t:t + 1]
        steps.append(ours(x_t, x_t, x_t, cache=cache)[0])  # one query sees everything cached
    assert cache.length == 7
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"attn_mask must be \(Tq, Tk\) = \(1, 8\)"):
        ours(x_t, x_t, x_t, cache=cache, attn_mask=torch.zeros(1, 7, dtype=torch.bool))
    assert cache.length == 7  # the failed call took its position back out


def test_cross_attention_cache_projects_memory_once():
    _, ours = torch_pair({})
    y, mem = torch.randn(3, B, E, dtype=F64), torch.randn(Tk, B, E, dtype=F64)
    cache = ours.init_cache(B, Tk, cross=True)
    steps = [ours(y[t:t + 1], mem, mem, cache=cache)[0] for t in range(3)]
    torch.testing.assert_close(torch.cat(steps), ours(y, mem, mem)[0], rtol=1e-12, atol=1e-12)
    assert cache.length == Tk


# -- in models ---------------------------------------------------------------------------


def test_encoder_layer_takes_it_as_self_attn():
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, dtype=F64)
    layer.self_attn = at.MultiheadAttention(E, H, dtype=F64)
    x = torch.randn(Tq, B, E, dtype=F64)
    assert layer(x, src_mask=nn.Transformer.generate_square_subsequent_mask(Tq, dtype=F64),
                 is_causal=True).shape == (Tq, B, E)


def _train(model: nn.Module, make_loss, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before any swap
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = make_loss(model)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _twins(build):
    torch.manual_seed(0)
    original = build()
    torch.manual_seed(0)
    return original, build()


@pytest.mark.parametrize("batch_first", [False, True])
def test_swapped_transformer_encoder_trains_as_the_original(batch_first):
    def build():
        layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=batch_first,
                                           dtype=F64)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    original, swapped = _twins(build)
    x = torch.randn(B, 6, E, dtype=F64)
    x = x if batch_first else x.transpose(0, 1)
    kpm = torch.zeros(B, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=F64)

    def loss(model):
        padded = model(x, src_key_padding_mask=kpm)
        masked = model(x, mask=causal, is_causal=True)
        return padded.square().mean() + masked.sin().mean()

    opt_params = list(swapped.parameters())
    replaced = at.swap_attention(swapped)
    assert list(replaced) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert all(type(m) is nn.MultiheadAttention for m in replaced.values())
    assert all(type(layer.self_attn) is at.MultiheadAttention for layer in swapped.layers)
    assert all(a is b for a, b in zip(opt_params, swapped.parameters()))  # shared, in order
    assert at.swap_attention(swapped) == {}  # nothing left to swap
    ref_losses, losses = _train(original, loss), _train(swapped, loss)
    assert losses == pytest.approx(ref_losses, rel=1e-12, abs=1e-12)
    for (name, p), q in zip(original.named_parameters(), swapped.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-11, atol=1e-12, msg=name)
    original.eval(), swapped.eval()  # eval + no_grad: torch's fast path, same parameters
    with torch.no_grad():
        torch.testing.assert_close(swapped(x, src_key_padding_mask=kpm),
                                   original(x, src_key_padding_mask=kpm))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch's, for seq-first
def test_swapped_transformer_trains_as_the_original_and_checkpoints_load_both_ways():
    def build():
        return nn.Transformer(E, H, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=16, dropout=0.0, dtype=F64)

    original, swapped = _twins(build)
    swapped.train(False)  # modes are kept: checked below, then set back
    replaced = at.swap_attention(swapped)
    assert sorted(replaced) == ["decoder.layers.0.multihead_attn",
                                "decoder.layers.0.self_attn", "encoder.layers.0.self_attn"]
    assert not swapped.decoder.layers[0].multihead_attn.training
    swapped.train()
    src, tgt = torch.randn(6, B, E, dtype=F64), torch.randn(5, B, E, dtype=F64)
    src_kpm = torch.zeros(B, 6, dtype=torch.bool)
    src_kpm[1, 3:] = True
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=F64)

    def loss(model):
        out = model(src, tgt, tgt_mask=tgt_mask, tgt_is_causal=True,
                    src_key_padding_mask=src_kpm, memory_key_padding_mask=src_kpm)
        return out.square().mean()

    assert _train(swapped, loss) == pytest.approx(_train(original, loss), rel=1e-12, abs=1e-12)
    torch.manual_seed(1)
    fresh_ours, fresh_torch = build(), build()
    at.swap_attention(fresh_ours)
    fresh_ours.load_state_dict(original.state_dict())  # torch checkpoint -> swapped model
    fresh_torch.load_state_dict(swapped.state_dict())  # swapped checkpoint -> torch model
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(fresh_ours(src, tgt), original(src, tgt))
        torch.testing.assert_close(fresh_torch(src, tgt), swapped(src, tgt))


def test_swap_attention_shared_layers_and_bad_targets():
    mha = nn.MultiheadAttention(E, H)
    model = nn.ModuleDict({"a": mha, "b": nn.Sequential(mha)})
    replaced = at.swap_attention(model)
    assert list(replaced) == ["a", "b.0"] and replaced["a"] is replaced["b.0"] is mha
    assert model["a"] is model["b"][0]  # still one layer, under both names
    with pytest.raises(TypeError, match="from_torch"):
        at.swap_attention(nn.MultiheadAttention(E, H))


@pytest.mark.parametrize("bias_dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("self_attention", [True, False])
def test_in_proj_bias_in_another_dtype_runs_as_in_torch(bias_dtype, self_attention):
    """Bug (audit): torch's layer runs a float32 input with an in_proj_bias of another
    dtype; attnkit's raised a bare RuntimeError from matmul. The bias is cast to the
    input's dtype, as torch's result shows."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True)
    ref.in_proj_bias.data = ref.in_proj_bias.data.normal_().to(bias_dtype)
    ours = at.MultiheadAttention.from_torch(ref, share_parameters=True)
    x, y = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    kv = x if self_attention else y
    want, want_w = ref(x, kv, kv)
    got, got_w = ours(x, kv, kv)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got_w, want_w, rtol=1e-3, atol=1e-3)
