"""A decoding loop is checked once, not at every step (issue 32).

One query under bottom-right (or no) causal sees every key, so ``attention()`` keeps its
checked structure under a signature without the key length: a loop whose Tk grows by one
per step runs the checks once. What that signature leaves out (Tk, k's and v's dtype and
device) must still be refused when wrong, and the key masks made from ``valid_lens`` are
kept per values read in the call, never per tensor.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import attnkit.torch as at
from attnkit.torch import _signature


@pytest.fixture
def counted(monkeypatch):
    """Empty signature tables, and a count of the full checks run."""
    monkeypatch.setattr(_signature, "_PREPARED", {})
    monkeypatch.setattr(_signature, "_STEPS", {}, raising=False)
    monkeypatch.setattr(_signature, "_LENGTH_MASKS", {}, raising=False)
    calls = []
    real = _signature.prepare

    def prepare(*args):
        calls.append(args[1].shape)
        return real(*args)

    monkeypatch.setattr(_signature, "prepare", prepare)
    return calls


def _buffers(B: int = 2, H: int = 4, T: int = 40, D: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, 1, D, generator=g), torch.randn(B, H, T, D, generator=g),
            torch.randn(B, H, T, D, generator=g))


def _key_mask(lengths: list[int], Tk: int) -> torch.Tensor:
    return (torch.arange(Tk) < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("form", ["causal", "no mask", "mask", "valid_lens"])
def test_a_decoding_loop_is_checked_once(counted, form):
    q, K, V = _buffers()
    real = torch.ones(2, 40, dtype=torch.bool)
    real[0, :3] = False  # a left-padded row
    for Tk in range(4, 40):
        k, v = K[:, :, :Tk], V[:, :, :Tk]  # the cache's filled part: one more per step
        kw: dict = {"causal": True} if form == "causal" else {}
        allowed = None
        if form == "mask":
            kw["mask"] = allowed = real[:, None, None, :Tk]
        elif form == "valid_lens":
            kw["valid_lens"] = torch.tensor([2, Tk - 1])
            allowed = _key_mask([2, Tk - 1], Tk)
        got, _ = at.attention(q, k, v, **kw)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, allowed))
    assert len(counted) == 1, f"checked {len(counted)} times over 36 steps"


def test_a_block_of_queries_is_still_checked_per_key_length(counted):
    """Several queries under causal see a band that depends on Tk: no shared signature."""
    _, K, V = _buffers()
    q = torch.randn(2, 4, 3, 8)
    for Tk in (5, 6):
        at.attention(q, K[:, :, :Tk], V[:, :, :Tk], causal=True)
    assert len(counted) == 2


def test_top_left_causal_is_not_shared_across_key_lengths(counted):
    q, K, V = _buffers()
    for Tk in (1, 5):  # one key: nothing masked; five: only the first is seen
        got, _ = at.attention(q, K[:, :, :Tk], V[:, :, :Tk], causal="top_left")
        torch.testing.assert_close(got, F.scaled_dot_product_attention(
            q, K[:, :, :Tk], V[:, :, :Tk], is_causal=True))


def test_a_known_step_signature_still_refuses_wrong_arguments(counted):
    q, K, V = _buffers()
    at.attention(q, K[:, :, :6], V[:, :, :6], causal=True)
    with pytest.raises(TypeError, match="share a dtype"):  # k's dtype: not in the signature
        at.attention(q, K[:, :, :7].double(), V[:, :, :7], causal=True)
    with pytest.raises(TypeError, match="share a dtype"):
        at.attention(q, K[:, :, :7], V[:, :, :7].double(), causal=True)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    at.attention(q, K[:, :, :6], V[:, :, :6], mask=mask)
    with pytest.raises(ValueError, match=r"\(2, 1, 1, 6\)"):  # a mask one key short
        at.attention(q, K[:, :, :7], V[:, :, :7], mask=mask)
    with pytest.raises(ValueError, match="k and v must agree"):  # v one key short
        at.attention(q, K[:, :, :7], V[:, :, :6], causal=True)


def test_lengths_checked_against_each_key_length(counted):
    q, K, V = _buffers()
    vl = torch.tensor([5, 5])
    at.attention(q, K[:, :, :5], V[:, :, :5], valid_lens=vl)  # kept for Tk = 5
    with pytest.raises(ValueError, match=r"\[0, 4\].*max 5"):
        at.attention(q, K[:, :, :4], V[:, :, :4], valid_lens=vl)


def test_a_lengths_mask_made_in_inference_mode_serves_a_call_with_autograd(counted):
    q, K, V = _buffers()
    k, v, vl = K[:, :, :9], V[:, :, :9], torch.tensor([4, 9])
    with torch.inference_mode():
        at.attention(q, k, v, valid_lens=vl)
    qg = q.clone().requires_grad_()
    at.attention(qg, k, v, valid_lens=vl)[0].sum().backward()
    qr = q.clone().requires_grad_()
    F.scaled_dot_product_attention(qr, k, v, _key_mask([4, 9], 9)).sum().backward()
    torch.testing.assert_close(qg.grad, qr.grad)


# -- MultiHeadAttention: a decoding step over its own cache -----------------------------


def test_a_multi_head_decoding_loop_runs_no_checks_per_step(counted):
    torch.manual_seed(0)
    m = at.MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 12, 16)
    cache = m.init_cache(2, 12)
    with torch.no_grad():
        m(x[:, :4], causal=True, cache=cache)  # the prompt: checked
        for t in range(4, 12):
            m(x[:, t:t + 1], causal=True, cache=cache)
    assert len(counted) == 1, f"checked {len(counted)} times: the prompt and 7 steps"


@pytest.mark.parametrize("Hkv", [4, 2])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("form", ["causal", "no causal", "valid_lens", "padded prompt"])
def test_decoding_steps_equal_attention_over_the_whole_prefix(Hkv, batch_first, form):
    """Each step, forward and backward (autograd on), against the same layer attending
    the projected prefix as explicit keys, no cache (the checked path). The cache holds
    earlier positions detached, so only q's and the output's projections get the same
    gradients."""
    torch.manual_seed(0)
    m = at.MultiHeadAttention(16, 4, num_kv_heads=Hkv, dtype=torch.float64,
                              batch_first=batch_first)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    real = torch.ones(2, 9, dtype=torch.bool)
    real[0, :2] = False  # row 0 left-padded
    seq = (lambda a: a) if batch_first else (lambda a: a.transpose(0, 1))
    cache = m.init_cache(2, 9, dtype=torch.float64)
    with torch.no_grad():
        m(seq(x[:, :5]), causal=True, cache=cache,
          padding_mask=real[:, :5] if form == "padded prompt" else None)
    for t in range(5, 9):
        kw: dict = {"causal": True} if form in ("causal", "padded prompt") else {}
        ref_kw: dict = {}
        if form == "valid_lens":
            kw["valid_lens"] = ref_kw["valid_lens"] = torch.tensor([t - 1, t + 1])
        if form == "padded prompt":
            ref_kw["padding_mask"] = real[:, :t + 1]
        m.zero_grad()
        got, _ = m(seq(x[:, t:t + 1]), cache=cache, **kw)
        got.sum().backward()
        grads = [p.grad.clone() for p in (*m.q_proj.parameters(), *m.out_proj.parameters())]
        m.zero_grad()
        want, _ = m(seq(x[:, t:t + 1]), seq(x[:, :t + 1]), seq(x[:, :t + 1]), **ref_kw)
        want.sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for g, p in zip(grads, (*m.q_proj.parameters(), *m.out_proj.parameters())):
            torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
    assert cache.length == 9


def test_a_cache_of_another_dtype_is_refused_and_left_as_it_was():
    m = at.MultiHeadAttention(16, 4).eval()
    cache = m.init_cache(2, 8, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(TypeError, match="share a dtype"):
        m(torch.randn(2, 1, 16), cache=cache, causal=True)
    assert cache.length == 0


def test_a_layer_with_other_key_widths_still_names_the_key_it_needs():
    """kdim != embed_dim: one new position cannot be its own key; said as before."""
    m = at.MultiHeadAttention(16, 4, kdim=8, vdim=8).eval()
    cache = m.init_cache(2, 8)
    with torch.no_grad(), pytest.raises(ValueError, match=r"key must be \(B, T, 8\)"):
        m(torch.randn(2, 1, 16), cache=cache, causal=True)
    assert cache.length == 0
