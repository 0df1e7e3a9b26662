"""The decoding path (attnkit.torch._decode): a few queries under a key mask, no autograd.

It must give the math path's answer, keep NaN/inf of masked keys and values out, let an
attended one through, and never read a tensor back; V goes through in slabs, so the tests
also shrink the slab to make several of them."""

from __future__ import annotations

import pytest
import torch

import attnkit.torch as at
import attnkit.torch.functional as functional
from attnkit.torch import _decode


@pytest.fixture
def taken(monkeypatch):
    """Count the calls that reach the decoding path."""
    calls = []
    real = functional.decode_path

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(functional, "decode_path", spy)
    return calls


def _inputs(G: int, Tk: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, Hkv, D = 3, 2, 8
    q = torch.randn(B, Hkv * G, 1, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Tk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Tk, D + 2, generator=g).to(dtype)
    return q, k, v


def _poison_masked(k: torch.Tensor, v: torch.Tensor, Tk: int) -> None:
    """NaN and inf in positions that batch row 1 masks (its last 7 keys)."""
    k[1, :, Tk - 3] = float("nan")
    v[1, :, Tk - 2] = float("nan")
    v[1, 0, Tk - 1, 1] = float("inf")


@pytest.mark.parametrize("slab_bytes", [None, 256])  # one slab; many
@pytest.mark.parametrize("keys_first", [False, True])  # both layouts of the scores
@pytest.mark.parametrize("G", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_decode_matches_math_and_keeps_masked_nan_out(
    taken, monkeypatch, slab_bytes, keys_first, G, dtype
):
    if slab_bytes is not None:
        monkeypatch.setattr(_decode, "SLAB_BYTES", slab_bytes)
    if keys_first:
        monkeypatch.setattr(_decode, "KEYS_FIRST_FROM", 0)
    Tk = 37
    q, k, v = _inputs(G, Tk, dtype)
    _poison_masked(k, v, Tk)
    vl = torch.tensor([Tk, Tk - 7, 0])  # full, padded, empty
    key_mask = (torch.arange(Tk) < vl[:, None])[:, None, None, :]
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    for kw in ({"valid_lens": vl}, {"mask": key_mask}, {"mask": key_mask, "causal": True}):
        with torch.no_grad():
            out, w = at.attention(q, k, v, **kw)
            ref, _ = at.attention(q, k, v, backend="math", **kw)
        assert w is None
        assert not out.isnan().any(), kw
        torch.testing.assert_close(out, ref, **tol)
        assert (out[2] == 0).all()  # no key: output 0
    assert len(taken) == 3


def test_decode_propagates_attended_nan_and_inf(taken):
    q, k, v = _inputs(1, 20, torch.float64)
    v[0, 1, 4, 2] = float("nan")
    v[0, 0, 5, 3] = float("inf")
    k[1, 0, 6] = float("nan")
    with torch.no_grad():
        out, _ = at.attention(q, k, v, valid_lens=torch.tensor([20, 20, 3]))
    assert out[0, 1, 0, 2].isnan() and out[0, 1].isfinite().sum() == v.shape[-1] - 1
    assert out[0, 0, 0, 3] == float("inf")
    assert out[1, 0].isnan().all() and out[1, 1].isfinite().all()
    assert out[2].isfinite().all()  # row 2 sees keys 0..2 only
    assert len(taken) == 1


@pytest.mark.parametrize("G, heads, seed", [(1, 2, 1), (4, 8, 2)])
def test_decode_per_head_key_mask_and_gqa_fallback(taken, G, heads, seed):
    """A key mask per head: the decoding path takes it without GQA (one call recorded);
    with GQA a per-query-head key mask is not the decoding path's and the math path
    serves (none recorded)."""
    q, k, v = _inputs(G, 9, torch.float64)
    per_head = torch.rand(3, heads, 1, 9, generator=torch.Generator().manual_seed(seed)) > 0.4
    with torch.no_grad():
        out, _ = at.attention(q, k, v, mask=per_head)
        ref, _ = at.attention(q, k, v, mask=per_head, backend="math")
    torch.testing.assert_close(out, ref)
    assert len(taken) == (1 if G == 1 else 0)


def test_decode_is_skipped_under_autograd_and_for_weights(taken):
    q, k, v = _inputs(1, 9, torch.float64)
    vl = torch.tensor([9, 4, 1])
    q.requires_grad_(True)
    out, _ = at.attention(q, k, v, valid_lens=vl)
    out.sum().backward()
    with torch.no_grad():
        at.attention(q, k, v, valid_lens=vl, need_weights=True)
    assert not taken


def test_decode_never_reads_a_tensor_back(taken, monkeypatch):
    monkeypatch.setattr(_decode, "SLAB_BYTES", 256)
    q, k, v = _inputs(2, 40, torch.float32)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to Python (a host sync)")

    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    with torch.no_grad():
        at.attention(q, k, v, valid_lens=torch.tensor([40, 3, 0]))
    assert len(taken) == 1


def test_decode_compiles_whole(monkeypatch):
    monkeypatch.setattr(_decode, "SLAB_BYTES", 256)
    q, k, v = _inputs(2, 40, torch.float32)
    vl = torch.tensor([40, 3, 0])

    def step(q, k, v, vl):
        return at.attention(q, k, v, valid_lens=vl)[0]

    with torch.no_grad():
        want = step(q, k, v, vl)
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, vl)
    torch.testing.assert_close(got, want)
