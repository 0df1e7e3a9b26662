"""Ring attention on the Triton kernels of ``attnkit.triton`` equals it on the torch path.

On CUDA the local blocks go to ``attnkit.triton.flash_attention_forward/backward``. This
checks that hand-off (slices made dense, bottom-right causal, GQA, LSE in float32, dK/dV
from the final LSE) on the CPU under ``TRITON_INTERPRET=1``, by routing CPU tensors to the
kernels. It needs ``attnkit.triton``, which lives in another package of this repository.
"""

from __future__ import annotations

import os

import pytest
import torch

import attnkit.torch.lse as lse_op
from attnkit.distributed import block_backward, block_forward, ring_attention
from attnkit.testing import assert_close_by_rule
from attnkit.torch._triton_path import triton_kernels

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first loaded
ops = pytest.importorskip("attnkit.triton", reason="attnkit.triton is not importable here")
if triton_kernels("flash_attention_forward", "flash_attention_backward") is None:
    pytest.skip("attnkit.triton kernels cannot run here (no Triton, or no CUDA and no "
                "TRITON_INTERPRET=1)", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def via_triton(monkeypatch):
    """Route every unmasked float block to the Triton kernels, CPU tensors included."""
    monkeypatch.setattr(
        lse_op, "_use_triton",
        lambda q, v, key_mask: (
            ops if key_mask is None and q.dtype in lse_op._TRITON_DTYPES else None
        ),
    )


def _qkv(shape, seed):
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    gen = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return mk(B, H, Tq, Dk), mk(B, Hkv, Tk, Dk), mk(B, Hkv, Tk, Dv), mk(B, H, Tq, Dv)


# Causal with Tq < Tk and Tq > Tk (bottom-right alignment, rows with no key); the full mask
# runs in the ring test below. Small: the interpreter runs every program in Python.
@pytest.mark.parametrize(
    "shape, causal",
    [((1, 4, 2, 19, 33, 16, 16), True), ((1, 2, 1, 33, 19, 32, 16), True)],
    ids=["GQA-Tq19-Tk33-causal", "MQA-Tq33-Tk19-causal"],
)
def test_block_ops_on_triton_match_torch_path(shape, causal, via_triton) -> None:
    q, k, v, dout = _qkv(shape, 0)
    ref_out, ref_lse = block_forward(q, k, v, causal=causal, scale=0.25)  # float64 torch path
    ref_g = block_backward(dout, q, k, v, ref_out, ref_lse, causal=causal, scale=0.25)
    f32 = [t.float().to(DEVICE) for t in (q, k, v, dout)]
    lse_op._use_triton, orig = (lambda q, v, key_mask: None), lse_op._use_triton
    try:
        b_out, b_lse = block_forward(*f32[:3], causal=causal, scale=0.25)
        b_g = block_backward(f32[3], *f32[:3], b_out, b_lse, causal=causal, scale=0.25)
    finally:
        lse_op._use_triton = orig
    out, lse = block_forward(*f32[:3], causal=causal, scale=0.25)
    assert lse.dtype == torch.float32
    g = block_backward(f32[3], *f32[:3], out, lse, causal=causal, scale=0.25)
    assert_close_by_rule(out, ref_out, b_out, factor=2, name="out")
    assert_close_by_rule(lse, ref_lse, b_lse, factor=2, name="lse")
    for name, got, r, b, f in zip(("dq", "dk", "dv"), g, ref_g, b_g, (5, 3, 3)):
        assert_close_by_rule(got, r, b, factor=f, name=name)


@pytest.mark.parametrize("causal, variants", [(False, False), (True, False), (True, True)],
                         ids=["full", "causal", "causal-softcap-sinks-segments"])
def test_one_rank_ring_on_triton_blocks(causal, variants, via_triton) -> None:
    """Plain, and with softcap, sinks and packed segment ids handed to the kernels."""
    q, k, v, dout = _qkv((1, 4, 2, 24, 24, 16, 16), 1)
    ids = torch.tensor([[0] * 7 + [1] * 11 + [-1] * 6]).to(DEVICE)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    opts = dict(softcap=3.0, segment_ids=ids) if variants else {}

    def run(dtype, triton: bool):
        leaves = [t.to(DEVICE, dtype).requires_grad_(True) for t in (q, k, v)]
        if variants:
            leaves.append(sinks.to(DEVICE, dtype).requires_grad_(True))
        saved = lse_op._use_triton
        if not triton:
            lse_op._use_triton = lambda q, v, key_mask: None
        try:
            out = ring_attention(*leaves[:3], causal=causal, sinks=leaves[3] if variants
                                 else None, **opts)
            return (out, *torch.autograd.grad(out, leaves, dout.to(DEVICE, dtype)))
        finally:
            lse_op._use_triton = saved

    ref, base, got = run(torch.float64, False), run(torch.float32, False), run(torch.float32, True)
    names = ("out", "dq", "dk", "dv", "dsinks")
    for name, g, r, b, f in zip(names, got, ref, base, (2, 5, 3, 3, 5)):
        assert_close_by_rule(g, r, b, factor=f, name=name)
