"""Ring attention and its block ops at the numerical and structural edges (issue 16), on
one process. The multi-process side (ranks that disagree, large logits across ranks) is in
``test_ring_multiprocess.py``.

- Logits ~1e4 (``attnkit.testing.large_logit_inputs``, exact in float32): float32 results
  follow the DESIGN.md rule. Before: the block backward rebuilt P from a float32 LSE (dk
  4.2e-2 off where plain float32 is off by 5e-5) and the ring merged float32 LSEs.
- ``shard_sequence`` of a length-0 sequence: empty shards (was IndexError).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit.distributed import gather_sequence, ring_attention, shard_sequence
from attnkit.distributed.ring import ring_attention_backward, ring_attention_forward
from attnkit.testing import assert_close_by_rule, large_logit_inputs, reference_attention
from attnkit.torch.lse import attention_with_lse, attention_with_lse_backward

FACTORS = {"out": 2, "dq": 5, "dk": 3, "dv": 3}


def _plain(q, k, v, dout, causal):
    """Plain same-dtype math with autograd: the baseline of the rule."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(G, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), -math.inf)
    out = torch.softmax(s, -1) @ v.repeat_interleave(G, 1)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _judge(got, arrays, causal):
    q, k, v, dout = (torch.from_numpy(x) for x in arrays)
    ref = reference_attention(q, k, v, d_out=dout, causal=causal)
    base = _plain(*(x.float() for x in (q, k, v, dout)), causal)
    for name, factor in FACTORS.items():
        assert got[name].dtype == torch.float32
        assert_close_by_rule(got[name], getattr(ref, name), base[name], factor=factor,
                             name=name)


@pytest.mark.parametrize("causal", [False, True])
def test_block_ops_follow_the_rule_at_logits_1e4(causal):
    arrays = large_logit_inputs(B=2, H=4, Hkv=2, Tq=24, Tk=24, seed=1)
    q, k, v, dout = (torch.from_numpy(x).float() for x in arrays)
    out, lse = attention_with_lse(q, k, v, causal=causal, scale=0.125,
                                  lse_dtype=torch.float64)
    assert lse.dtype == torch.float64
    dq, dk, dv = attention_with_lse_backward(dout, q, k, v, out, lse, causal=causal,
                                             scale=0.125)
    _judge(dict(out=out, dq=dq, dk=dk, dv=dv), arrays, causal)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_one_rank_ring_follows_the_rule_at_logits_1e4(causal, layout):
    arrays = large_logit_inputs(B=1, H=2, Tq=32, Tk=32, seed=2)
    q, k, v, dout = (torch.from_numpy(x).float() for x in arrays)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = ring_attention(*leaves, causal=causal, layout=layout)
    out.backward(dout)
    _judge(dict(out=out.detach(), dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad),
           arrays, causal)
    _, lse = ring_attention_forward(q, k, v, causal=causal, layout=layout)
    assert lse.dtype == torch.float64
    ref = reference_attention(*arrays[:3], causal=causal).lse
    assert np.max(np.abs(lse.numpy() - ref)) < 1e-5  # float32 would be 4.9e-4


def test_public_backward_accepts_a_float32_lse():
    # Gradients from a float32 LSE are as good as that LSE (normal logits: the rule holds).
    g = torch.Generator().manual_seed(4)
    q, k, v, dout = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(4))
    out, lse = ring_attention_forward(q, k, v, causal=True)
    a = ring_attention_backward(dout, q, k, v, out, lse, causal=True)
    b = ring_attention_backward(dout, q, k, v, out, lse.float(), causal=True)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_length_zero_sequence_shards_to_empty_shards():
    x = torch.randn(2, 3, 0, 4)
    for layout in ("zigzag", "contiguous"):
        shard = shard_sequence(x, layout=layout)
        assert shard.shape == (2, 3, 0, 4)
        assert gather_sequence(shard, layout=layout).shape == (2, 3, 0, 4)
    leaves = [torch.zeros(1, 2, 0, 4, requires_grad=True) for _ in range(3)]
    out = ring_attention(*leaves, causal=True)
    out.sum().backward()
    assert out.shape == (1, 2, 0, 4) and all(t.grad.shape == (1, 2, 0, 4) for t in leaves)
