"""attnkit's Triton kernels as torch.library custom ops: torch.library.opcheck on each
(schema, fake implementation against the real one, autograd registration, AOT dispatch),
and torch.compile(fullgraph=True) through them. Under TRITON_INTERPRET=1 on the CPU
(tiny sizes: the interpreter is slow), on a GPU compiled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if torch.cuda.is_available() else torch.float32


@pytest.fixture(autouse=True)
def _registered(at):
    """The ops are registered when attnkit.triton.ops is imported (the kernels load
    lazily, on first use)."""
    import attnkit.triton.ops  # noqa: F401


def _qkv(Tq: int = 9, Tk: int = 11, grad: bool = True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, Tq, 16, generator=g).to(DEVICE, DTYPE)
    k = torch.randn(1, 1, Tk, 16, generator=g).to(DEVICE, DTYPE)
    v = torch.randn(1, 1, Tk, 16, generator=g).to(DEVICE, DTYPE)
    return [x.requires_grad_(grad) for x in (q, k, v)]


@pytest.mark.parametrize("causal, left, right", [(True, None, None), (False, 3, 1)])
def test_opcheck_flash_forward(causal, left, right, at):
    q, k, v = _qkv()
    sinks = torch.zeros(2, device=DEVICE, requires_grad=True)
    torch.library.opcheck(
        torch.ops.attnkit.flash_fwd.default,
        (q, k, v, sinks, "bottom_right" if causal else "none", left, right, 0.25, None, None,
         None, None))


def test_opcheck_flash_backward(at):
    q, k, v = _qkv(grad=False)
    out, lse = at.flash_attention_forward(q, k, v, causal=True)
    dout = torch.randn_like(out)
    ids = torch.tensor([[0] * 5 + [1] * 4]).to(DEVICE), torch.tensor([[0] * 6 + [1] * 5]).to(DEVICE)
    torch.library.opcheck(
        torch.ops.attnkit.flash_bwd.default,
        (dout, q, k, v, out, lse, torch.zeros_like(lse), None, "bottom_right", None, None, 0.25,
         5.0, None, *ids))


def test_opcheck_decode(at):
    q, k, v = _qkv(Tq=2, Tk=20, grad=False)
    torch.library.opcheck(torch.ops.attnkit.decode.default,
                          (q, k, v, 13, None, 0.25, None, None, None, None, 2))
    lens = torch.tensor([13]).to(DEVICE)
    torch.library.opcheck(torch.ops.attnkit.decode.default,
                          (q, k, v, 0, lens, 0.25, 3.0, torch.zeros(2, device=DEVICE), 4, None,
                           None))


def test_flash_attention_compiles_whole_and_matches_eager(at):
    """The kernel is one node of the graph (fullgraph=True: a graph break would raise),
    forward and backward, with eager mode's values."""
    torch._dynamo.reset()
    q, k, v = _qkv()
    sinks = torch.zeros(2, device=DEVICE)

    def fn(q, k, v):
        out, lse = at.flash_attention(q, k, v, causal=True, window=(4, None), sinks=sinks,
                                      return_lse=True)
        return (out * out).sum() + lse.sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    loss = torch.compile(fn, fullgraph=True, backend=counter)(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    ref = fn(q, k, v)
    ref_grads = torch.autograd.grad(ref, (q, k, v))
    assert counter.frame_count == 1
    torch.testing.assert_close(loss, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_decode_attention_compiles_whole(at):
    torch._dynamo.reset()
    q, k, v = _qkv(Tq=1, Tk=20, grad=False)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda q, k, v: at.decode_attention(q, k, v, 13), fullgraph=True,
                       backend=counter)
    torch.testing.assert_close(fn(q, k, v), at.decode_attention(q, k, v, 13))
    assert counter.frame_count == 1
