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
