"""MultiHeadAttention.from_torch / .to_torch against torch.nn.MultiheadAttention: outputs
and weights equal to float64 rounding over bias, kdim/vdim, batch_first, key padding, bool
and float attn_mask, averaged and per-head weights; batch_first, training mode and state
dicts kept both ways, and torch's RNG left alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnkit.torch as at

B, Tq, Tk, E, H = 2, 5, 6, 8, 2
MASKS = ["none", "key_padding", "bool_2d", "float_2d", "bool_3d", "all"]


def _masks(kind: str, gen: torch.Generator) -> tuple[dict, dict]:
    """(nn.MultiheadAttention kwargs, attnkit kwargs) for the same masking."""
    kpm = torch.zeros(B, Tk, dtype=torch.bool)
    kpm[1, 4:] = True  # True = ignore
    bool2 = torch.rand(Tq, Tk, generator=gen) > 0.7  # True = NOT allowed
    bool2[:, 0] = False  # keep one key per row so nn.MultiheadAttention gives no NaN
    float2 = torch.randn(Tq, Tk, generator=gen, dtype=torch.float64)
    bool3 = torch.rand(B * H, Tq, Tk, generator=gen) > 0.7
    bool3[..., 0] = False
    if kind == "none":
        return {}, {}
    if kind == "key_padding":
        return {"key_padding_mask": kpm}, {"mask": at.from_key_padding_mask(kpm)}
    if kind == "bool_2d":
        return {"attn_mask": bool2}, at.from_attn_mask(bool2)
    if kind == "float_2d":
        return {"attn_mask": float2}, at.from_attn_mask(float2)
    if kind == "bool_3d":  # (B*H, Tq, Tk), batch-major as nn.MultiheadAttention lays it out
        return {"attn_mask": bool3}, {"mask": ~bool3.view(B, H, Tq, Tk)}
    keep = at.from_key_padding_mask(kpm) & ~bool2
    return {"key_padding_mask": kpm, "attn_mask": bool2}, {"mask": keep}


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kvdim", [None, (3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_grid(bias, kvdim, batch_first, masks, average):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(1)
    kdim, vdim = kvdim or (None, None)
    ref = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first,
                                dtype=torch.float64).eval()
    if bias:  # non-zero biases, so that a dropped or misplaced bias shows
        with torch.no_grad():
            ref.in_proj_bias.normal_(generator=gen)
            ref.out_proj.bias.normal_(generator=gen)
    ours = at.MultiHeadAttention.from_torch(ref)
    query = torch.randn(B, Tq, E, generator=gen, dtype=torch.float64)
    key = torch.randn(B, Tk, kdim or E, generator=gen, dtype=torch.float64)
    value = torch.randn(B, Tk, vdim or E, generator=gen, dtype=torch.float64)
    ref_kw, our_kw = _masks(masks, gen)
    tr = (lambda x: x) if batch_first else (lambda x: x.transpose(0, 1))
    ref_out, ref_w = ref(tr(query), tr(key), tr(value), need_weights=True,
                         average_attn_weights=average, **ref_kw)
    assert ours.batch_first == batch_first  # called in the same layout as `ref`
    out, w = ours(tr(query), tr(key), tr(value), need_weights=True, average_weights=average,
                  **our_kw)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(w, ref_w, rtol=1e-12, atol=1e-13)
    out_fused, none = ours(tr(query), tr(key), tr(value), **our_kw)
    assert none is None
    torch.testing.assert_close(out_fused, ref_out, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kvdim", [None, (3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_to_torch_roundtrip(bias, kvdim, batch_first):
    kdim, vdim = kvdim or (None, None)
    ours = at.MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, dropout=0.25,
                                 batch_first=batch_first, dtype=torch.float64).eval()
    rng_state = torch.get_rng_state()
    ref = ours.to_torch()
    back = at.MultiHeadAttention.from_torch(ref)
    assert torch.equal(torch.get_rng_state(), rng_state)  # conversions draw nothing
    assert ref.batch_first == back.batch_first == batch_first
    assert ref.dropout == back.dropout == 0.25 and not ref.training and not back.training
    tr = (lambda x: x) if batch_first else (lambda x: x.transpose(0, 1))
    x = tr(torch.randn(B, Tq, E, dtype=torch.float64))
    mem_k = tr(torch.randn(B, Tk, kdim or E, dtype=torch.float64))
    mem_v = tr(torch.randn(B, Tk, vdim or E, dtype=torch.float64))
    ref_out, ref_w = ref(x, mem_k, mem_v)
    out, w = ours(x, mem_k, mem_v, need_weights=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(w, ref_w, rtol=1e-12, atol=1e-13)
    for sd, sd_back in ((ours.state_dict(), back.state_dict()),
                        (ref.state_dict(), back.to_torch().state_dict())):
        assert list(sd) == list(sd_back)
        for name in sd:
            assert torch.equal(sd[name], sd_back[name]), name


def test_from_torch_keeps_training_mode_and_rng():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dropout=0.1, dtype=torch.float64)  # train mode
    rng_state = torch.get_rng_state()
    ours = at.MultiHeadAttention.from_torch(ref)
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert ours.training and not ours.batch_first and ours.dropout == 0.1
    x = torch.randn(Tq, B, E, dtype=torch.float64)  # (T, B, E), as `ref` takes it
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x)[0], ref(x, x, x)[0], rtol=1e-12, atol=1e-13)


def test_gradients_match_nn_multihead_attention():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    ours = at.MultiHeadAttention.from_torch(ref)
    x = torch.randn(B, Tq, E, dtype=torch.float64)
    kpm = torch.tensor([[False] * Tq, [False] * 3 + [True] * (Tq - 3)])
    ref(x, x, x, key_padding_mask=kpm)[0].square().sum().backward()
    ours(x, mask=at.from_key_padding_mask(kpm))[0].square().sum().backward()
    w_q, w_k, w_v = ref.in_proj_weight.grad.chunk(3)
    torch.testing.assert_close(ours.q_proj.weight.grad, w_q, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(ours.k_proj.weight.grad, w_k, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(ours.v_proj.weight.grad, w_v, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad,
                               rtol=1e-11, atol=1e-13)


def test_unsupported_conversions_raise():
    with pytest.raises(ValueError, match="add_bias_kv"):
        at.MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        at.MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_zero_attn=True))
    with pytest.raises(ValueError, match="no GQA"):
        at.MultiHeadAttention(E, 4, num_kv_heads=2).to_torch()
    with pytest.raises(ValueError, match="head_dim"):
        at.MultiHeadAttention(E, 2, head_dim=3).to_torch()
    with pytest.raises(ValueError, match="softcap=30.0"):
        at.MultiHeadAttention(E, H, softcap=30.0).to_torch()
    with pytest.raises(ValueError, match="sinks=on"):
        at.MultiHeadAttention(E, H, sinks=True).to_torch()
    with pytest.raises(TypeError, match="MultiheadAttention"):
        at.MultiHeadAttention.from_torch(nn.Linear(2, 2))
