"""softcap, sinks, segment_ids and top-left causal on attnkit.torch.attention's paths (math,
SDPA, auto) and modules, against the float64 loop reference (attnkit.testing), forward,
weights and gradients (d_sinks included); lower precision by DESIGN.md's rule; gradcheck."""

from __future__ import annotations

import sys
import zlib

import numpy as np
import pytest
import torch

import attnkit.numpy as an
import attnkit.torch as at
from attnkit.testing import assert_close_by_rule, reference_attention
from attnkit.torch import masks

# (B, H, Hkv, Tq, Tk, Dk, Dv)
SHAPES = {
    "Tq<Tk": (2, 2, 2, 5, 9, 4, 4),
    "Tq>Tk": (2, 2, 2, 9, 5, 4, 3),
    "GQA": (2, 4, 2, 7, 7, 8, 8),
}

CASES = {
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": "*"},
    "top_left": {"causal": "top_left"},
    "top_left+window": {"causal": "top_left", "window": (2, None)},
    "segments(runs)": {"segment_ids": "runs"},
    "segments(scattered)": {"segment_ids": "scattered"},
    "sinks+causal": {"sinks": "*", "causal": True},
    "sinks+top_left": {"sinks": "*", "causal": "top_left"},
    "sinks+bias+mask": {"sinks": "*", "bias": "*", "mask": "*"},
    "sinks+segments+window": {"sinks": "*", "segment_ids": "runs", "window": (1, 2)},
    "softcap+bias+valid_lens": {"softcap": 2.0, "bias": "*", "valid_lens": "*"},
    "all": {"softcap": 1.0, "sinks": "*", "segment_ids": "scattered", "causal": "top_left",
            "window": (3, 1), "bias": "*", "scale": 0.7},
}


def draw(shape, case, seed):
    """Float64 numpy arrays q, k, v, d_out and the case's options (numpy values)."""
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, case, seed)).encode()))
    q, k, v = (rng.standard_normal(s) for s in ((B, H, Tq, Dk), (B, Hkv, Tk, Dk),
                                                 (B, Hkv, Tk, Dv)))
    kw = dict(CASES[case])
    if "sinks" in kw:
        kw["sinks"] = rng.standard_normal(H)
    if "bias" in kw:
        kw["bias"] = rng.standard_normal((H, 1, Tk))
    if "mask" in kw:
        kw["mask"] = rng.random((B, 1, Tq, Tk)) < 0.7
        kw["mask"][0, :, 1] = False  # a fully masked row: the sink takes its mass
    if "valid_lens" in kw:
        kw["valid_lens"] = np.array([Tk, 0])[:B]
    if kw.get("segment_ids") == "runs":  # contiguous runs: the packed path on CPU
        q_ids = np.sort(rng.integers(-1, 3, (B, Tq)), axis=-1)
        kv_ids = np.sort(rng.integers(-1, 3, (B, Tk)), axis=-1)
        kw["segment_ids"] = (q_ids, kv_ids)
    elif kw.get("segment_ids") == "scattered":  # ids that come back: the dense mask path
        kw["segment_ids"] = (rng.integers(-1, 2, (B, Tq)), rng.integers(-1, 2, (B, Tk)))
    d_out = rng.standard_normal((B, H, Tq, Dv))
    return (q, k, v, d_out), kw


def tensors(kw, dtype=torch.float64):
    """The options as tensors (floats in ``dtype``)."""
    out = {}
    for name, value in kw.items():
        if name == "segment_ids":
            out[name] = tuple(torch.tensor(x) for x in value)
        elif isinstance(value, np.ndarray):
            t = torch.tensor(value)
            out[name] = t.to(dtype) if t.is_floating_point() else t
        else:
            out[name] = value
    return out


def run(arrays, kw, backend, dtype=torch.float64, need_weights=True):
    q, k, v, d_out = (torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays)
    tkw = tensors(kw, dtype)
    if "sinks" in tkw:
        tkw["sinks"].requires_grad_(True)
    out, w = at.attention(q, k, v, backend=backend, need_weights=need_weights, **tkw)
    out.backward(d_out.detach())
    d_sinks = tkw["sinks"].grad if "sinks" in tkw else None
    return out, w, (q.grad, k.grad, v.grad, d_sinks)


@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_float64_matches_the_reference(shape, case, backend) -> None:
    arrays, kw = draw(shape, case, 0)
    if backend == "sdpa" and "softcap" in kw:
        with pytest.raises(ValueError, match="backend='sdpa' cannot take softcap"):
            run(arrays, kw, backend)
        return
    ref = reference_attention(*arrays[:3], d_out=arrays[3], **kw)
    out, w, grads = run(arrays, kw, backend)
    np.testing.assert_allclose(out.detach().numpy(), ref.out, atol=1e-12)
    np.testing.assert_allclose(w.detach().numpy(), ref.weights, atol=1e-12)
    for name, g, r in zip(("dq", "dk", "dv", "dsinks"), grads, ref[3:]):
        if r is not None:
            np.testing.assert_allclose(g.numpy(), r, atol=1e-11, err_msg=name)


LOW = [("GQA", "sinks+causal"), ("Tq<Tk", "sinks+top_left"), ("Tq>Tk", "top_left"),
       ("GQA", "segments(runs)"), ("Tq<Tk", "sinks+bias+mask"), ("Tq>Tk", "all")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape_case", LOW, ids=["+".join(c) for c in LOW])
def test_lower_precision_by_rule(shape_case, dtype) -> None:
    """sdpa and auto against the float64 reference, with attnkit's math path in the same
    dtype as the baseline: 2x (out), 3x (dK, dV, d_sinks), 5x (dQ), plus 1e-5."""
    shape, case = SHAPES[shape_case[0]], shape_case[1]
    arrays, kw = draw(shape, case, 1)
    ref = reference_attention(*arrays[:3], d_out=arrays[3], **kw)
    base_out, _, base_grads = run(arrays, kw, "math", dtype, need_weights=False)
    for backend in ("auto",) if "softcap" in kw else ("sdpa", "auto"):
        out, _, grads = run(arrays, kw, backend, dtype, need_weights=False)
        assert out.dtype == dtype
        assert_close_by_rule(out, ref.out, base_out, factor=2, name=f"{backend} out")
        for name, factor, g, r, b in zip(("dq", "dk", "dv", "dsinks"), (5, 3, 3, 3), grads,
                                         ref[3:], base_grads):
            if r is not None:
                assert_close_by_rule(g, r, b, factor=factor, name=f"{backend} {name}")


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck(backend) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (torch.tensor(rng.standard_normal(s), requires_grad=True)
               for s in ((1, 2, 3, 4), (1, 1, 4, 4), (1, 1, 4, 2)))
    sinks = torch.tensor(rng.standard_normal(2), requires_grad=True)
    ids = (torch.tensor([[0, 0, 1]]), torch.tensor([[0, 1, 1, -1]]))
    softcap = 2.0 if backend == "math" else None

    def f(q, k, v, sinks):
        return at.attention(q, k, v, sinks=sinks, softcap=softcap, causal="top_left",
                            segment_ids=ids, backend=backend)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))


def test_top_left_causal_runs_on_sdpas_own_is_causal(monkeypatch) -> None:
    """For Tq != Tk too: no mask is built when top-left causal is the only constraint."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal))  # given by position or by keyword
        return real(q, k, v, attn_mask, dropout_p, is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    for sinks in (None, torch.zeros(2)):
        calls.clear()
        out, _ = at.attention(q, k, v, causal="top_left", sinks=sinks, backend="sdpa")
        assert calls == [(None, True)]
        ref = reference_attention(q, k, v, causal="top_left",
                                  sinks=None if sinks is None else sinks.numpy())
        np.testing.assert_allclose(out.numpy(), ref.out, atol=1e-5)


# -- packed documents and padding ---------------------------------------------------------


def test_packed_documents_equal_each_document_alone(monkeypatch) -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([5, 9, 2, 7])
    T, H = 25, 4  # two padding positions at the end
    ids = at.segment_ids_from_lengths(lengths, T)
    assert ids.tolist() == [[0] * 5 + [1] * 9 + [2] * 2 + [3] * 7 + [-1, -1]]
    q, k, v = (torch.randn(1, H, T, 8, requires_grad=True) for _ in range(3))
    sinks = torch.randn(H, requires_grad=True)
    for backend in ("math", "sdpa"):
        out, w = at.attention(q, k, v, segment_ids=ids, causal=True, sinks=sinks,
                              backend=backend, need_weights=True)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v, sinks), g)
        start, d_sinks = 0, torch.zeros(H)
        for n in lengths.tolist():
            sl = slice(start, start + n)
            alone, w_alone = at.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], causal=True,
                                          sinks=sinks, backend=backend, need_weights=True)
            torch.testing.assert_close(out[:, :, sl], alone)
            torch.testing.assert_close(w[:, :, sl, sl], w_alone)
            alone_grads = torch.autograd.grad(alone, (q, k, v, sinks), g[:, :, sl])
            for got, want in zip(grads[:3], alone_grads[:3]):
                torch.testing.assert_close(got[:, :, sl], want[:, :, sl])
            d_sinks += alone_grads[3]
            start += n
        torch.testing.assert_close(grads[3], d_sinks)
        assert torch.all(out[:, :, -2:] == 0) and torch.all(w[:, :, -2:] == 0)
        for grad in grads[:3]:  # padding queries and keys: zero gradients
            assert torch.all(grad[:, :, -2:] == 0)


def test_packed_path_is_taken_and_equals_the_dense_mask(monkeypatch) -> None:
    import attnkit.torch._packed as packed

    torch.manual_seed(1)
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1], [0, 0, 0, 0, 1, 1, 1, 1, 1]])
    q, k, v = (torch.randn(2, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    seen = []
    real = packed.packed_attention
    monkeypatch.setattr("attnkit.torch.functional.packed_attention",
                        lambda *a, **kw: seen.append(1) or real(*a, **kw))
    monkeypatch.setattr(packed, "_CALL_COST", 0)  # small blocks: still take the path
    for kw in ({"causal": True}, {"window": (1, 1)}, {"causal": "top_left"}):
        out, _ = at.attention(q, k, v, segment_ids=ids, **kw)
        keep = at.attention_mask((2, 2, 9, 9), segment_ids=ids, **kw)
        dense, _ = at.attention(q, k, v, mask=keep, backend="math")
        torch.testing.assert_close(out, dense)
    assert len(seen) == 3
    # q/kv ids with Tq != Tk (cross-attention): blocks keep the whole matrix's alignment
    q_ids, kv_ids = torch.tensor([[0, 0, 1, 1]]), torch.tensor([[0, 0, 0, 1, 1, 1, -1]])
    qc, kc = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 7, 4,
                                                                        dtype=torch.float64)
    for kw in ({"causal": True}, {"causal": "top_left"}, {"window": (2, 0)}):
        out, _ = at.attention(qc, kc, kc, segment_ids=(q_ids, kv_ids), **kw)
        ref = reference_attention(qc, kc, kc, segment_ids=(q_ids.numpy(), kv_ids.numpy()), **kw)
        np.testing.assert_allclose(out.numpy(), ref.out, atol=1e-12)
    assert packed.packed_runs(torch.tensor([[0, 1, 0]]), torch.tensor([[0, 1, 0]])) is None


def test_left_padded_rows_equal_the_unpadded_sequence() -> None:
    torch.manual_seed(2)
    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    ids = at.segment_ids_from_padding_mask(real)
    assert ids[0].tolist() == [-1, -1, -1, 0, 0, 0, 0]
    mha = at.MultiHeadAttention(8, 2, sinks=True, softcap=5.0).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    y, _ = mha(x, causal=True, segment_ids=ids)
    alone, _ = mha(x[:1, 3:], causal=True)
    torch.testing.assert_close(y[:1, 3:], alone)
    torch.testing.assert_close(y[1:], mha(x[1:], causal=True)[0])
    torch.testing.assert_close(y[0, :3], mha.out_proj.bias.expand(3, 8))  # attention output 0


def test_segment_id_helpers_match_numpy() -> None:
    cu = torch.tensor([[0, 2, 2, 5], [0, 1, 4, 4]])
    np.testing.assert_array_equal(at.segment_ids_from_cu_seqlens(cu, 6).numpy(),
                                  an.segment_ids_from_cu_seqlens(cu.numpy(), 6))
    lengths = torch.tensor([3, 0, 2])
    np.testing.assert_array_equal(at.segment_ids_from_lengths(lengths, 6).numpy(),
                                  an.segment_ids_from_lengths(lengths.numpy(), 6))
    with pytest.raises(ValueError, match="sum to at most total=4"):
        at.segment_ids_from_lengths(torch.tensor([3, 2]), 4)
    with pytest.raises(ValueError, match="only 0 and 1"):
        at.segment_ids_from_padding_mask(torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="must start at 0"):
        at.segment_ids_from_cu_seqlens(torch.tensor([1, 3]), 4)


def test_segment_id_helpers_never_read_a_tensor_back(monkeypatch) -> None:
    """Off the CPU (here: told that the tensors are not on the host) the helpers check
    nothing that would need their values back."""
    monkeypatch.setattr(masks, "_on_host", lambda x: False)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to Python (a host sync)")

    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    at.segment_ids_from_cu_seqlens(torch.tensor([[0, 2, 2, 5], [0, 1, 4, 4]]), 6)
    at.segment_ids_from_lengths(torch.tensor([3, 0, 2]), 6)
    at.segment_ids_from_padding_mask(torch.tensor([[0, 1, 1], [1, 1, 0]]))


# -- modules ------------------------------------------------------------------------------


def test_mha_learns_sinks_and_matches_the_numpy_oracle() -> None:
    torch.manual_seed(3)
    mha = at.MultiHeadAttention(12, 4, num_kv_heads=2, sinks=True, softcap=3.0).double()
    assert mha.sinks.shape == (4,) and torch.all(mha.sinks == 0)
    assert "sinks" in dict(mha.named_parameters())
    with torch.no_grad():
        mha.sinks.copy_(torch.randn(4))
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    ids = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
    y, w = mha(x, causal="top_left", segment_ids=ids, need_weights=True,
               average_weights=False)
    y.sum().backward()
    assert mha.sinks.grad is not None and torch.all(torch.isfinite(mha.sinks.grad))
    ref_y, ref_w = an.multi_head_attention(
        mha.to_numpy_params(), x.numpy(), causal="top_left", segment_ids=ids.numpy(),
        sinks=mha.sinks.detach().numpy(), softcap=3.0,
    )
    np.testing.assert_allclose(y.detach().numpy(), ref_y, atol=1e-12)
    np.testing.assert_allclose(w.detach().numpy(), ref_w, atol=1e-12)
    assert "softcap=3.0" in repr(mha) and "sinks=True" in repr(mha)


def test_dot_product_attention_takes_the_variants() -> None:
    torch.manual_seed(4)
    layer = at.DotProductAttention(softcap=2.0, sinks=True)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    ids = (torch.tensor([[0, 0, 1], [0, 0, 0]]), torch.tensor([[0, 1, 1, 1, -1]] * 2))
    out = layer(q, k, v, causal="top_left", segment_ids=ids)
    out.sum().backward()
    assert layer.sinks.grad is not None and layer.attention_weights.shape == (2, 3, 5)
    ref = reference_attention(q[:, None], k[:, None], v[:, None], softcap=2.0,
                              sinks=np.zeros(1), causal="top_left",
                              segment_ids=tuple(i.numpy() for i in ids))
    np.testing.assert_allclose(out.detach().numpy(), ref.out[:, 0], atol=1e-5)


# -- errors -------------------------------------------------------------------------------


def test_bad_variants_raise_naming_shapes() -> None:
    q = k = v = torch.zeros(2, 3, 4, 5)
    ids = torch.zeros(2, 4, dtype=torch.long)
    cases = [
        ({"segment_ids": torch.zeros(2, 5, dtype=torch.long)}, ValueError,
         r"\(B, T\) = \(2, 4\) .* got \(2, 5\)"),
        ({"segment_ids": torch.zeros(2, 4)}, TypeError, "must hold integers, got dtype float32"),
        ({"segment_ids": (ids, torch.zeros(1, 4, dtype=torch.long))}, ValueError,
         r"kv_ids must have shape \(B, Tk\) = \(2, 4\)"),
        ({"segment_ids": (ids, np.zeros((2, 4), dtype=np.int64))}, TypeError, "torch.Tensor"),
        ({"sinks": torch.zeros(4)}, ValueError, r"\(H,\) = \(3,\).* got \(4,\)"),
        ({"sinks": torch.zeros(3, dtype=torch.long)}, TypeError, "sinks must hold floats"),
        ({"softcap": 0.0}, ValueError, "softcap must be a positive"),
        ({"softcap": -2}, ValueError, "softcap must be a positive"),
        ({"causal": "top-left"}, ValueError, "'bottom_right' or 'top_left'"),
    ]
    for kw, err, match in cases:
        with pytest.raises(err, match=match):
            at.attention(q, k, v, **kw)


def test_every_variant_reaches_the_triton_kernel(monkeypatch) -> None:
    """The kernels take softcap, sinks, segment_ids and top-left causal: a CUDA half call
    with all of them goes to attnkit.triton with each passed on, not to another path."""
    import types

    import attnkit
    from attnkit.torch import _triton_path as tp

    seen = {}

    def fake_flash(q, k, v, **kw):
        seen.update(kw)
        return torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)

    fake = types.ModuleType("attnkit.triton")
    fake.is_available = lambda: True
    fake.flash_attention = fake_flash
    monkeypatch.setitem(sys.modules, "attnkit.triton", fake)
    monkeypatch.setattr(attnkit, "triton", fake, raising=False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q = torch.randn(2, 4, 4, 8, dtype=torch.float16)  # Tq < Tk: the alignments differ
    k = torch.randn(2, 2, 6, 8, dtype=torch.float16)
    q_ids = torch.tensor([[0, 1, 1, -1]] * 2)
    ids = torch.tensor([[0, 0, 0, 1, 1, -1]] * 2)
    assert tp.triton_reason("cuda", q.dtype, tuple(q.shape), tuple(k.shape), 8, False, False,
                            False) is None
    at.attention(q, k, k, causal="top_left", softcap=30.0, sinks=torch.zeros(4),
                 segment_ids=(q_ids, ids), backend="triton")
    assert seen["causal"] == "top_left" and seen["softcap"] == 30.0
    assert seen["sinks"].shape == (4,)
    got_q, got_kv = seen["segment_ids"]
    assert torch.equal(got_q, q_ids) and torch.equal(got_kv, ids)


def test_packed_runs_follow_the_ids_and_skip_decoding_steps(monkeypatch) -> None:
    """The runs come from the ids of each call (nothing is kept on the caller's tensor, so
    a write through ``.data`` or under ``inference_mode`` is seen); a decoding step never
    reads the ids."""
    from attnkit.torch import _packed

    found = []
    real = _packed._blocks
    monkeypatch.setattr(_packed, "_blocks", lambda *a: found.append(1) or real(*a))
    ids = at.segment_ids_from_lengths(torch.tensor([200, 150, 162]), 512)
    q = torch.randn(1, 2, 512, 8)
    with torch.no_grad():
        first, _ = at.attention(q, q, q, segment_ids=ids, causal=True)
        dense, _ = at.attention(q, q, q, mask=at.segment_mask(ids, (1, 2, 512, 512)),
                                causal=True)
        torch.testing.assert_close(first, dense)
        ids.data[0, 300:] = 1  # a write that bumps no version counter
        after, _ = at.attention(q, q, q, segment_ids=ids, causal=True)
        want, _ = at.attention(q, q, q, mask=at.segment_mask(ids, (1, 2, 512, 512)),
                               causal=True)
        torch.testing.assert_close(after, want)
        n = len(found)
        at.attention(q[:, :, -1:], q, q, segment_ids=(ids[:, -1:], ids))  # one query
        assert len(found) == n
    with torch.inference_mode():
        got, _ = at.attention(q, q, q, segment_ids=ids, causal=True)
    torch.testing.assert_close(got, want)


def test_valid_lens_masks_follow_the_lengths_and_run_under_inference_mode() -> None:
    q = torch.randn(2, 2, 3, 8)
    k = torch.randn(2, 2, 6, 8)
    vl = torch.tensor([2, 5])
    ref = lambda lens: at.attention(q, k, k, mask=at.sequence_mask(lens, 6)[:, None, None])  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(at.attention(q, k, k, valid_lens=vl)[0], ref(vl)[0])
        vl.data[0] = 4  # a write that bumps no version counter
        torch.testing.assert_close(at.attention(q, k, k, valid_lens=vl)[0], ref(vl)[0])
    with torch.inference_mode():
        out, _ = at.attention(q, k, k, valid_lens=vl)
        mha = at.MultiHeadAttention(8, 2).eval()
        mha(torch.randn(2, 3, 8), valid_lens=torch.tensor([1, 3]))
    torch.testing.assert_close(out, ref(vl)[0])
