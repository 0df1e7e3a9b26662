"""ring_attention with no process group (world size 1): plain attention, usable anywhere."""

from __future__ import annotations

import pytest
import torch

from attnkit.distributed import gather_sequence, ring_attention, shard_sequence
from attnkit.testing import assert_close_by_rule

CASES = [  # (B, H, Hkv, T, Dk, Dv)
    (2, 2, 2, 10, 7, 7),
    (1, 4, 2, 26, 5, 3),  # GQA, Dk != Dv
    (2, 3, 1, 34, 59, 8),  # MQA
]


def _inputs(shape, dtype=torch.float64, seed=0):
    B, H, Hkv, T, Dk, Dv = shape
    gen = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    return mk(B, H, T, Dk), mk(B, Hkv, T, Dk), mk(B, Hkv, T, Dv), mk(B, H, T, Dv)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("valid", [None, "with_empty_row"])
@pytest.mark.parametrize("shape", CASES, ids=str)
def test_one_rank_equals_reference_float64(shape, causal, layout, valid, attention_ref) -> None:
    q, k, v, dout = _inputs(shape)
    valid_lens = None
    if valid:
        valid_lens = torch.tensor([0] + [shape[3] // 3] * (shape[0] - 1))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = ring_attention(*leaves, causal=causal, layout=layout, valid_lens=valid_lens)
    got = (out, *torch.autograd.grad(out, leaves, dout))
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = attention_ref(*ref_leaves, causal=causal, valid_lens=valid_lens)
    want = (ref, *torch.autograd.grad(ref, ref_leaves, dout))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert not torch.isnan(g).any(), name
        err = (g - w).abs().max().item()
        assert err <= 1e-10, f"{name}: max error {err:.3e}"
    if valid:
        assert all((g[0] == 0).all() for g in got), "fully masked batch row must be 0"


@pytest.mark.parametrize("causal", [False, True])
def test_one_rank_float32_by_rule(causal, attention_ref) -> None:
    q, k, v, dout = _inputs((2, 4, 2, 64, 32, 32), seed=1)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, causal=causal)
        return (out, *torch.autograd.grad(out, leaves, dout.to(dtype)))

    ref = run(attention_ref, torch.float64)
    base = run(attention_ref, torch.float32)
    got = run(ring_attention, torch.float32)
    for name, g, r, b, f in zip(("out", "dq", "dk", "dv"), got, ref, base, (2, 5, 3, 3)):
        assert g.dtype == torch.float32
        assert_close_by_rule(g, r, b, factor=f, name=name)


def test_gradcheck_causal_gqa() -> None:
    q, k, v, _ = _inputs((1, 4, 2, 6, 3, 2), seed=2)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: ring_attention(a, b, c, causal=True, scale=0.7), leaves
    )


def test_inputs_are_not_modified() -> None:
    q, k, v, dout = _inputs(CASES[1])
    before = [t.clone() for t in (q, k, v, dout)]
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    ring_attention(*leaves, causal=True).backward(dout)
    for a, b in zip((q, k, v, dout), before):
        assert torch.equal(a.detach(), b)


def test_shard_and_gather_are_identity_on_one_rank() -> None:
    x = torch.randn(2, 3, 8, 4)
    for layout in ("zigzag", "contiguous"):
        s = shard_sequence(x, layout=layout)
        assert torch.equal(s, x)
        assert torch.equal(gather_sequence(s, layout=layout), x)


def test_errors_name_the_shapes() -> None:
    x = torch.zeros(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"T=5 must be a multiple of 2"):
        ring_attention(x, x, x)  # zigzag on one rank: 2 chunks
    with pytest.raises(ValueError, match="not divisible by 2 chunks"):
        shard_sequence(x)
    q, kv = torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"H=3 .* Hkv=2.*\(1, 3, 4, 8\)"):
        ring_attention(q, kv, kv)
    with pytest.raises(TypeError, match="must share a dtype"):
        ring_attention(q, kv.double(), kv)
    with pytest.raises(ValueError, match=r"q and k/v shards must have the same length"):
        ring_attention(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8))
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, 4\] \(the sequence length"):
        ring_attention(kv, kv, kv, valid_lens=torch.tensor([5]))
    with pytest.raises(ValueError, match=r"shape \(B,\) = \(1,\)"):
        ring_attention(kv, kv, kv, valid_lens=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_attention(kv, kv, kv, layout="striped")


@pytest.mark.parametrize("causal", [False, True])
def test_one_rank_variants_equal_reference_float64(causal) -> None:
    """Softcap, sinks and packed segment ids (with padding) on one rank; the sinks'
    gradient is the whole gradient there."""
    from attnkit.testing import reference_attention

    q, k, v, dout = _inputs(CASES[1], seed=4)
    B, T = q.shape[0], q.shape[2]
    ids = (torch.arange(T) // 7).expand(B, T).clone()
    ids[:, -3:] = -1
    sinks = torch.linspace(-1.0, 1.0, q.shape[1], dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    out = ring_attention(*leaves[:3], causal=causal, softcap=2.0, sinks=leaves[3],
                         segment_ids=ids)
    grads = torch.autograd.grad(out, leaves, dout)
    ref = reference_attention(q, k, v, causal=causal, softcap=2.0, sinks=sinks,
                              segment_ids=ids, d_out=dout)
    for name, g, w in zip(("out", "dq", "dk", "dv", "dsinks"), (out, *grads),
                          (ref.out, ref.dq, ref.dk, ref.dv, ref.dsinks)):
        err = (g - torch.from_numpy(w)).abs().max().item()
        assert err <= 1e-10, f"{name}: max error {err:.3e}"
    assert (out.transpose(1, 2)[ids < 0] == 0).all()


def test_bad_variant_arguments_name_the_shard() -> None:
    x = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"segment_ids shard.*T/P = 4.*\(1, 4\).*\(1, 5\)"):
        ring_attention(x, x, x, segment_ids=torch.zeros(1, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match="segment_ids shard.*integers"):
        ring_attention(x, x, x, segment_ids=torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"sinks must have shape \(H,\) = \(2,\)"):
        ring_attention(x, x, x, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="softcap"):
        ring_attention(x, x, x, softcap=-1.0)
