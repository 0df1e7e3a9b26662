"""The pieces ring attention is made of, in one process: block attention with its LSE,
block backward from the final LSE, and the log-sum-exp merge (including -inf rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.torch.lse as lse_op
from attnkit.distributed import block_backward, block_forward, merge_partials
from attnkit.numpy import flash_attention
from attnkit.numpy import merge_partials as np_merge

NEG_INF = -math.inf


def _qkv(gen, B, H, Hkv, Tq, Tk, Dk, Dv, dtype=torch.float64):
    return (
        torch.randn(B, H, Tq, Dk, generator=gen, dtype=dtype),
        torch.randn(B, Hkv, Tk, Dk, generator=gen, dtype=dtype),
        torch.randn(B, Hkv, Tk, Dv, generator=gen, dtype=dtype),
    )


@pytest.fixture(params=[None, 16], ids=["one_tile", "row_tiles16"])
def row_tile(request, monkeypatch):
    """Run the torch path with its default tile and with query rows split into tiles of 16."""
    if request.param is not None:
        monkeypatch.setattr(lse_op, "_ROW_TILE", request.param)
    return request.param


SHAPES = [  # (H, Hkv, Tq, Tk, Dk, Dv)
    (2, 2, 37, 37, 7, 7),
    (4, 2, 19, 53, 5, 3),  # GQA, Tq < Tk
    (3, 1, 53, 19, 1, 6),  # MQA, Tq > Tk: causal leaves the top rows with no key
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_forward_matches_numpy_flash(shape, causal, row_tile) -> None:
    H, Hkv, Tq, Tk, Dk, Dv = shape
    q, k, v = _qkv(torch.Generator().manual_seed(1), 2, H, Hkv, Tq, Tk, Dk, Dv)
    out, lse = block_forward(q, k, v, causal=causal, scale=0.3)
    ref_out, ref_lse = flash_attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, scale=0.3,
                                       return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=0, atol=1e-12)
    if causal and Tq > Tk:
        assert torch.isneginf(lse[..., : Tq - Tk]).all() and (out[..., : Tq - Tk, :] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_backward_with_final_lse_equals_autograd(shape, causal, row_tile) -> None:
    H, Hkv, Tq, Tk, Dk, Dv = shape
    gen = torch.Generator().manual_seed(2)
    q, k, v = _qkv(gen, 2, H, Hkv, Tq, Tk, Dk, Dv)
    dout = torch.randn(2, H, Tq, Dv, generator=gen, dtype=torch.float64)
    key_mask = torch.rand(2, Tk, generator=gen) > 0.3
    key_mask[0] = False  # batch row 0: every query row fully masked
    scale = 1 / math.sqrt(Dk)
    out, lse = block_forward(q, k, v, causal=causal, scale=scale, key_mask=key_mask)
    dq, dk, dv = block_backward(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                key_mask=key_mask)

    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    G = H // Hkv
    s = qr @ kr.repeat_interleave(G, 1).transpose(-1, -2) * scale
    keep = key_mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        keep = keep & torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    s = torch.where(keep, s, NEG_INF)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
    l = p.sum(-1, keepdim=True)
    ref = (p / torch.where(l == 0, 1.0, l)) @ vr.repeat_interleave(G, 1)
    rq, rk, rv = torch.autograd.grad(ref, (qr, kr, vr), dout)
    for name, got, want in (("out", out, ref.detach()), ("dq", dq, rq), ("dk", dk, rk),
                            ("dv", dv, rv)):
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)
    assert (dq[0] == 0).all() and (dk[0] == 0).all() and (dv[0] == 0).all()
    assert torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_split_keys_merge_and_backward_sum_to_whole(causal) -> None:
    """The ring identity: partials over disjoint key blocks merge to the whole, and block
    gradients computed from the final (out, lse) sum to the whole gradient."""
    gen = torch.Generator().manual_seed(3)
    B, H, Hkv, T, D = 2, 4, 2, 24, 8
    q, k, v = _qkv(gen, B, H, Hkv, T, T, D, D)
    dout = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[0, 5:] = False  # rows of batch 0 see no allowed key in the later blocks
    key_mask[1] = False  # batch 1 fully masked
    scale = 1 / math.sqrt(D)
    cuts = [0, 5, 12, 24]
    out = torch.zeros(B, H, T, D, dtype=torch.float64)
    lse = torch.full((B, H, T), NEG_INF, dtype=torch.float64)
    for a, b in zip(cuts, cuts[1:]):
        # Global causal over key block [a, b): query i sees key j iff j <= i, i.e. only the
        # rows i >= a, and the block's own diagonal in the rows [a, b).
        if causal:
            rows = slice(a, T)
            o, l = block_forward(q[:, :, rows], k[:, :, a:b], v[:, :, a:b], causal=False,
                                 scale=scale, key_mask=key_mask[:, a:b])
            od, ld = block_forward(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True,
                                   scale=scale, key_mask=key_mask[:, a:b])
            o, l = o.clone(), l.clone()
            o[:, :, : b - a], l[:, :, : b - a] = od, ld
        else:
            rows = slice(0, T)
            o, l = block_forward(q, k[:, :, a:b], v[:, :, a:b], causal=False, scale=scale,
                                 key_mask=key_mask[:, a:b])
        out[:, :, rows], lse[:, :, rows] = merge_partials(out[:, :, rows], lse[:, :, rows], o, l)
    whole, whole_lse = block_forward(q, k, v, causal=causal, scale=scale, key_mask=key_mask)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, whole_lse, rtol=0, atol=1e-12)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()

    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for a, b in zip(cuts, cuts[1:]):
        for rows, blk_causal in ([(slice(a, b), True), (slice(b, T), False)] if causal
                                 else [(slice(0, T), False)]):
            gq, gk, gv = block_backward(dout[:, :, rows], q[:, :, rows], k[:, :, a:b],
                                        v[:, :, a:b], out[:, :, rows], lse[:, :, rows],
                                        causal=blk_causal, scale=scale,
                                        key_mask=key_mask[:, a:b])
            dq[:, :, rows] += gq
            dk[:, :, a:b] += gk
            dv[:, :, a:b] += gv
    wq, wk, wv = block_backward(dout, q, k, v, whole, whole_lse, causal=causal, scale=scale,
                                key_mask=key_mask)
    for got, want in ((dq, wq), (dk, wk), (dv, wv)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def _random_partials(gen, shape=(3, 4, 6)):
    out_a = torch.randn(*shape, 5, generator=gen, dtype=torch.float64)
    out_b = torch.randn(*shape, 5, generator=gen, dtype=torch.float64)
    lse_a = torch.randn(*shape, generator=gen, dtype=torch.float64) * 30 + 700  # exp overflows
    lse_b = torch.randn(*shape, generator=gen, dtype=torch.float64) * 30 + 700
    lse_a[0, :, :3] = NEG_INF  # one side empty
    lse_b[1, :, 2:] = NEG_INF
    lse_a[2, 1], lse_b[2, 1] = NEG_INF, NEG_INF  # both empty
    return out_a, lse_a, out_b, lse_b


def test_merge_matches_numpy_reference_with_inf_sides() -> None:
    out_a, lse_a, out_b, lse_b = _random_partials(torch.Generator().manual_seed(4))
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = np_merge(out_a.numpy(), lse_a.numpy(), out_b.numpy(), lse_b.numpy())
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(lse.numpy(), ref_lse)
    assert (out[2, 1] == 0).all() and torch.isneginf(lse[2, 1]).all()
    # An empty side passes the other through unchanged.
    torch.testing.assert_close(out[0, :, :3], out_b[0, :, :3], rtol=0, atol=0)


def test_merge_empty_side_does_not_leak_nan_and_is_symmetric() -> None:
    out_a, lse_a, out_b, lse_b = _random_partials(torch.Generator().manual_seed(5))
    out_a = torch.where(torch.isneginf(lse_a)[..., None], math.nan, out_a)
    out_b = torch.where(torch.isneginf(lse_b)[..., None], math.nan, out_b)
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    out2, lse2 = merge_partials(out_b, lse_b, out_a, lse_a)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, out2, rtol=1e-15, atol=0)
    torch.testing.assert_close(lse, lse2, rtol=0, atol=0)


def test_merge_float32_partials_keep_float32_lse() -> None:
    parts = _random_partials(torch.Generator().manual_seed(6))
    out_a, lse_a, out_b, lse_b = (t.float() for t in parts)
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert not torch.isnan(out).any()


def test_merge_rejects_mismatched_shapes() -> None:
    a = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"partials do not match.*\(2, 3, 4\)"):
        merge_partials(a, torch.zeros(2, 3), torch.zeros(2, 3, 5), torch.zeros(2, 3))


def test_block_forward_rejects_bad_heads() -> None:
    q, k, v = torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"H=3 .* Hkv=2.*\(1, 3, 4, 8\)"):
        block_forward(q, k, v, causal=False, scale=1.0)


def test_block_forward_half_precision_statistics_in_float32() -> None:
    gen = torch.Generator().manual_seed(7)
    qkv = _qkv(gen, 1, 2, 2, 9, 9, 16, 16, torch.float32)
    q, k, v = (t.to(torch.bfloat16) * 40 for t in qkv)
    out, lse = block_forward(q, k, v, causal=True, scale=1.0)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@settings(max_examples=30, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 19), max_size=4, unique=True),
    keep_bits=st.lists(st.booleans(), min_size=20, max_size=20),
    seed=st.integers(0, 2**16),
)
def test_property_any_key_split_merges_to_the_whole(cuts, keep_bits, seed) -> None:
    """Split the keys anywhere, mask any of them (rows may end up with no key in a part, or
    in all parts): merging the parts' partials in any order equals attention over all keys."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 1, 2, 1, 5, 20, 4, 3)
    key_mask = torch.tensor(keep_bits)[None, :]
    bounds = [0, *sorted(cuts), 20]
    parts = [
        block_forward(q, k[:, :, a:b], v[:, :, a:b], causal=False, scale=0.5,
                      key_mask=key_mask[:, a:b])
        for a, b in zip(bounds, bounds[1:])
    ]
    out, lse = parts[-1]
    for o, l in reversed(parts[:-1]):  # the ring merges in its own order
        out, lse = merge_partials(o, l, out, lse)
    whole, whole_lse = block_forward(q, k, v, causal=False, scale=0.5, key_mask=key_mask)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, whole_lse, rtol=0, atol=1e-12)


VARIANTS = {  # options of block_forward beyond causal/scale; "ids" picks segment ids
    "softcap": dict(softcap=2.5),
    "sinks": dict(sinks=True),
    "segments": dict(ids="pair"),
    "top_left": dict(causal="top_left"),
    "all": dict(causal="top_left", softcap=4.0, sinks=True, ids="pair"),
}


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_block_variants_match_the_float64_reference(shape, variant, row_tile) -> None:
    """Softcap, sinks, segment ids (padding and an id no key has included) and top-left
    causal in the torch path, forward and backward (and the sinks' gradient), against
    attnkit.testing.reference_attention."""
    from attnkit.testing import reference_attention
    from attnkit.torch.lse import sinks_backward

    H, Hkv, Tq, Tk, Dk, Dv = shape
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(gen, 2, H, Hkv, Tq, Tk, Dk, Dv)
    opts = dict(VARIANTS[variant])
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(H, generator=gen, dtype=torch.float64) * 2
    if opts.pop("ids", None):
        q_ids = torch.randint(-1, 3, (2, Tq), generator=gen)
        kv_ids = torch.sort(torch.randint(-1, 2, (2, Tk), generator=gen), dim=1).values
        opts["segment_ids"] = (q_ids, kv_ids)  # id 2: queries with no key
    opts.setdefault("causal", True)
    dout = torch.randn(2, H, Tq, Dv, generator=gen, dtype=torch.float64)
    out, lse = block_forward(q, k, v, scale=0.4, **opts)
    sinks = opts.pop("sinks", None)
    dq, dk, dv = block_backward(dout, q, k, v, out, lse, scale=0.4, **opts)
    ref = reference_attention(q, k, v, scale=0.4, sinks=sinks, d_out=dout, **opts)
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv),
                               (ref.out, ref.lse, ref.dq, ref.dk, ref.dv)):
        np.testing.assert_array_equal(np.isneginf(got.numpy()), np.isneginf(want), name)
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12, err_msg=name)
    if sinks is not None:
        np.testing.assert_allclose(sinks_backward(dout, out, lse, sinks).numpy(), ref.dsinks,
                                   rtol=0, atol=1e-11)
