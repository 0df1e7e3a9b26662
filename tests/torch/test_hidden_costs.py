"""No hidden costs: a masked call never reads a tensor back to Python (no host sync), and
torch.compile(fullgraph=True) traces attention and MultiHeadAttention whole (no graph
break), with the results of eager mode."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit.torch as at


def _inputs(seed: int = 0, Tq: int = 5, Tk: int = 7, Dv: int = 6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, Tq, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, Tk, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, Tk, Dv, generator=g, requires_grad=True)
    return g, q, k, v


def _calls(g: torch.Generator, Tq: int, Tk: int) -> list[dict]:
    """One call per constraint, and all of them at once."""
    mask = torch.rand(2, 1, Tq, Tk, generator=g) > 0.3
    bias = torch.randn(Tq, Tk, generator=g)
    vl = torch.tensor([3, Tk])
    return [
        {"mask": mask},
        {"mask": mask[:, :, :1]},  # a key mask
        {"bias": bias},
        {"valid_lens": vl},
        {"valid_lens": torch.tensor([[1] * Tq, list(range(Tq))])},  # per query, empty rows
        {"causal": True},
        {"window": (2, 1)},
        {"need_weights": True, "causal": True, "valid_lens": vl},
        {"need_weights": True, "mask": mask, "bias": bias, "window": (None, 0)},
        {"causal": "top_left", "softcap": 5.0},  # the variants of issue 12
        {"sinks": torch.randn(4, generator=g), "valid_lens": vl, "need_weights": True},
    ]


def _segment_ids(Tq: int, Tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key ids whose runs interleave (under torch.compile every layout takes the
    dense mask path; in eager mode on the CPU the ids are read to look for packed runs)."""
    return (torch.tensor([[0, 1] * Tq][:1])[:, :Tq].expand(2, Tq).contiguous(),
            torch.tensor([[1, 0] * Tk][:1])[:, :Tk].expand(2, Tk).contiguous())


@pytest.fixture
def no_readback(monkeypatch):
    """Make every way of reading a tensor's value back into Python raise."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to Python (a host sync)")

    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("Tq", [1, 5, 7])  # decoding (one query), a block, Tq == Tk
@pytest.mark.parametrize("Dv", [6, 8])  # Dv == Dk: SDPA's flash kernel on the CPU
def test_masked_calls_never_read_a_tensor_back(no_readback, backend, Tq, Dv):
    g, q, k, v = _inputs(Tq=Tq, Dv=Dv)
    # segment_ids are left out: on the CPU they are read once, by design, to find packed
    # documents (attnkit.torch._packed; skipped under torch.compile, tested below); so are
    # valid_lens, read on the CPU to be checked (on a GPU they are clamped instead).
    for kw in _calls(g, Tq, 7):
        if "valid_lens" in kw:
            continue
        if backend == "sdpa" and "softcap" in kw:
            continue  # SDPA has no softcap (the call raises, saying so)
        out, w = at.attention(q, k, v, backend=backend, **kw)
        loss = out.sum() if w is None else out.sum() + w.sum()
        torch.autograd.grad(loss, (q, k, v))
        with torch.no_grad():  # the inference forms: decoding, fix-ups after the kernel
            at.attention(q, k, v, backend=backend, **kw)


def test_modules_never_read_a_tensor_back(no_readback):
    torch.manual_seed(0)
    m = at.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(2, 6, 16)
    pad = (torch.arange(6) < torch.tensor([4, 6])[:, None])[:, None, None, :]  # (B, 1, 1, T)
    out, w = m(x, causal=True, mask=pad, need_weights=True)
    (out.sum() + w.sum()).backward()
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :4], causal=True, cache=cache, mask=pad[..., :4])
        m(x[:, 4:5], causal=True, cache=cache, mask=pad[..., :5])
    add = at.AdditiveAttention(16, 16, 8)
    out, _ = at.additive_attention(x, x, x, add.W_q.weight.T, add.W_k.weight.T,
                                   add.w_v.weight[0], mask=pad[:, 0])
    out.sum().backward()


@pytest.mark.parametrize("kw", [
    {"causal": True}, {"causal": "top_left"}, {"causal": False},
    {"causal": True, "key_mask": torch.tensor([[True] * 5 + [False] * 2, [True] * 7])},
    {"causal": False, "segment_ids": (torch.tensor([[0, 0, 1, 1, 1]] * 2),
                                      torch.tensor([[0, 0, 0, 1, 1, 1, -1]] * 2))},
])
def test_the_lse_op_never_reads_a_tensor_back(no_readback, kw):
    """Ring attention's block op (attnkit.torch.lse): nothing is read back, whatever the
    values hold (it used to read back whether a masked block was all finite)."""
    from attnkit.torch.lse import attention_with_lse, attention_with_lse_backward

    g, q, k, v = _inputs(Tq=5)
    with torch.no_grad():
        v = v.clone()
        v[0, 1, 6, 2] = float("nan")  # a key the first rows may not attend
    out, lse = attention_with_lse(q, k, v, scale=0.3, **kw)
    attention_with_lse_backward(torch.ones_like(out), q, k, v, out, lse, scale=0.3, **kw)


def _compiled(fn):
    """``fn`` compiled whole (a graph break raises) with a counter of compiled frames."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, fullgraph=True, backend=counter), counter


@pytest.mark.parametrize("Tq", [1, 5])
def test_attention_compiles_whole_and_matches_eager(Tq):
    """Every constraint, need_weights, decoding and a block, forward and backward: one
    graph (fullgraph=True, zero graph breaks), the values and gradients of eager mode."""
    torch._dynamo.reset()
    g, q, k, v = _inputs(Tq=Tq)
    calls = _calls(g, Tq, 7) + [{"segment_ids": _segment_ids(Tq, 7), "causal": True}]

    def all_calls(q, k, v):
        outs = []
        for kw in calls:
            out, w = at.attention(q, k, v, **kw)
            outs += [out] if w is None else [out, w]
        return outs

    fn, counter = _compiled(all_calls)
    got, want = fn(q, k, v), all_calls(q, k, v)
    assert counter.frame_count == 1  # one graph: no break
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(sum(o.sum() for o in got), (q, k, v))
    ref = torch.autograd.grad(sum(o.sum() for o in want), (q, k, v))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_paths_taken_only_when_dk_equals_dv_compile_whole():
    """SDPA's flash kernel under is_causal (keys left as they are in eager mode), the
    in-place softmax of need_weights and a KV-cache step that calls SDPA directly all
    need Dk == Dv, which the calls above (Dv = 6) never reach: a bug once broke the graph
    there (torch.backends.cuda.flash_sdp_enabled() is not traceable)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    m = at.MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 6, 16)

    def fn(q, k, v, x):
        cache = m.init_cache(2, 8)
        outs = [at.attention(q, k, v, causal=True)[0],
                *at.attention(q, k, v, causal=True, need_weights=True),
                m(x[:, :4], causal=True, cache=cache)[0],
                m(x[:, 4:5], causal=True, cache=cache)[0], m(x[:, 5:6], cache=cache)[0]]
        return outs

    compiled, counter = _compiled(fn)
    with torch.no_grad():
        got, want = compiled(q, k, v, x), fn(q, k, v, x)
    assert counter.frame_count == 1
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_multi_head_attention_with_cache_compiles_whole_and_matches_eager():
    """A causal prefill and a decoding step through a KV cache, with padding, forward and
    backward: one graph, eager's outputs and parameter gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = at.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(2, 6, 16)

    def steps(x, cache):
        out, _ = m(x[:, :4], causal=True, cache=cache, valid_lens=torch.tensor([3, 4]))
        step, _ = m(x[:, 4:5], causal=True, cache=cache, valid_lens=torch.tensor([4, 5]))
        return out.square().sum() + step.square().sum()

    fn, counter = _compiled(steps)
    cache = m.init_cache(2, 8)
    loss = fn(x, cache)
    loss.backward()
    got = {n: p.grad.clone() for n, p in m.named_parameters()}
    assert counter.frame_count == 1 and cache.length == 5
    m.zero_grad()
    cache = m.init_cache(2, 8)
    ref = steps(x, cache)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for n, p in m.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_graph_breaks_counted_by_explain_are_zero():
    """torch._dynamo.explain's count, for a causal MultiHeadAttention forward with padding
    (five breaks before: one per finiteness check)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = at.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    explained = torch._dynamo.explain(lambda x: m(x, causal=True,
                                                  valid_lens=torch.tensor([2, 5]))[0])(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


class _CountOps(TorchDispatchMode):
    """Every aten op dispatched inside the ``with`` block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kw, most", [
    ({"valid_lens": torch.tensor([200, 256])}, 8),  # SDPA with the same key mask: 4
    ({"causal": True}, 3),  # SDPA's is_causal: 1
    ({}, 1),
])
def test_a_masked_call_costs_sdpa_plus_the_mask_it_needs(kw, most):
    """The aten ops of one call (B=2, H=8, T=256, D=64, no grad): the kernel and the
    mask it needs, nothing that passes over q, k or v (issue 23 counted 35 and 25)."""
    q = torch.randn(2, 8, 256, 64)
    with torch.no_grad(), _CountOps() as counted:
        at.attention(q, q, q, **kw)
    assert len(counted.ops) <= most, counted.ops
    assert sum("scaled_dot_product" in op for op in counted.ops) == 1, counted.ops
