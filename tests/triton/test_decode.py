"""attnkit.triton.decode_attention: split-K decoding over a KV cache read in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit.numpy as an
from attnkit.testing import as_float64, assert_close_by_rule

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.float16 if ON_GPU else torch.float32
CAPACITY = 4100 if ON_GPU else 90
D_ODD = 80 if ON_GPU else 40


def _cache(B, Hkv, D, Dv, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, Hkv, CAPACITY, D, generator=g)
    v = torch.randn(B, Hkv, CAPACITY, Dv, generator=g)
    return k.to(DEVICE, DTYPE), v.to(DEVICE, DTYPE)


@pytest.mark.parametrize(
    "B, H, Hkv, Tq, D, cache_len, num_splits",
    [
        (2, 4, 2, 1, 32, 37, None),  # GQA, one query, default split plan
        (1, 4, 4, 1, D_ODD, CAPACITY - 3, 3),  # chunk (cdiv) not a multiple of the tile
        (2, 8, 2, 3, 32, CAPACITY // 2 + 1, 5),  # 3 new queries: causal among them
        (1, 4, 1, 2, 64, 19, 19),  # MQA, one key per chunk
        (1, 2, 2, 4, 32, 2, 2),  # cache shorter than Tq: first rows see nothing
    ],
)
def test_decode_matches_full_attention(B, H, Hkv, Tq, D, cache_len, num_splits, at):
    k_cache, v_cache = _cache(B, Hkv, D, D, seed=cache_len)
    # Positions past cache_len hold garbage a correct kernel never reads.
    k_cache[:, :, cache_len:] = float("nan")
    v_cache[:, :, cache_len:] = float("inf")
    q = torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(1)).to(DEVICE, DTYPE)
    saved = [x.clone() for x in (q, k_cache, v_cache)]
    out, lse = at.decode_attention(q, k_cache, v_cache, cache_len, return_lse=True,
                                   num_splits=num_splits)
    for before, after in zip(saved, (q, k_cache, v_cache)):
        assert torch.equal(before.nan_to_num(), after.nan_to_num())  # caller data unchanged

    kv = [as_float64(x[:, :, :cache_len]) for x in (k_cache, v_cache)]
    out_ref, _ = an.scaled_dot_product_attention(as_float64(q), *kv, causal=True)
    _, lse_ref = an.flash_attention(as_float64(q), *kv, causal=True, return_lse=True)
    k_s, v_s = (x[:, :, :cache_len].repeat_interleave(H // Hkv, 1) for x in (k_cache, v_cache))
    # Baseline: plain math in the same dtype (rows with no key: 0 and -inf, as DESIGN says).
    s = (q @ k_s.transpose(-1, -2)) * D ** -0.5
    i = torch.arange(Tq, device=DEVICE)[:, None] + cache_len - Tq
    keep = torch.arange(cache_len, device=DEVICE)[None, :] <= i
    s = s.masked_fill(~keep, float("-inf"))
    base_lse = torch.logsumexp(s.float(), -1)
    base = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v_s
    assert_close_by_rule(out, out_ref, base, factor=2, name="out")
    assert_close_by_rule(lse, lse_ref, base_lse, factor=2, name="lse")
    if cache_len < Tq:
        assert torch.all(out[:, :, : Tq - cache_len] == 0)
        assert torch.all(lse[:, :, : Tq - cache_len] == float("-inf"))


def test_decode_equals_flash_attention_on_the_slice(at):
    """Same function as the prefill kernel on the valid part of the cache."""
    k_cache, v_cache = _cache(1, 2, 32, 32, seed=3)
    q = torch.randn(1, 4, 2, 32, generator=torch.Generator().manual_seed(4)).to(DEVICE, DTYPE)
    L = CAPACITY - 11
    out = at.decode_attention(q, k_cache, v_cache, L, num_splits=4, scale=0.3)
    full = at.flash_attention_forward(q, k_cache[:, :, :L], v_cache[:, :, :L], causal=True,
                                      scale=0.3)[0]
    tol = 1e-5 if DTYPE == torch.float32 else 2e-3
    torch.testing.assert_close(out, full, atol=tol, rtol=tol)


def test_split_count_does_not_change_the_result(at):
    k_cache, v_cache = _cache(1, 1, 32, 32, seed=5)
    q = torch.randn(1, 2, 1, 32, generator=torch.Generator().manual_seed(6)).to(DEVICE, DTYPE)
    outs = [at.decode_attention(q, k_cache, v_cache, CAPACITY - 1, num_splits=n)
            for n in (1, 2, 7, 40)]  # 40: the merge walks its splits in several blocks
    tol = 1e-5 if DTYPE == torch.float32 else 2e-3
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=tol, rtol=tol)


def test_empty_cache_gives_zero_and_minus_inf(at):
    k_cache, v_cache = _cache(1, 1, 32, 32, seed=7)
    q = torch.ones(1, 1, 1, 32, device=DEVICE, dtype=DTYPE)
    out, lse = at.decode_attention(q, k_cache, v_cache, 0, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_decode_rejects_bad_arguments(at):
    k_cache, v_cache = _cache(1, 2, 32, 32, seed=8)
    q = torch.ones(1, 3, 1, 32, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="Hkv=2"):
        at.decode_attention(q, k_cache, v_cache, 4)
    q = torch.ones(1, 2, 1, 32, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="capacity"):
        at.decode_attention(q, k_cache, v_cache, CAPACITY + 1)
    with pytest.raises(TypeError, match="cache_len"):
        at.decode_attention(q, k_cache, v_cache, 2.5)
    with pytest.raises(TypeError, match="float64"):
        at.decode_attention(q.double(), k_cache, v_cache, 2)
    assert np.isfinite(as_float64(at.decode_attention(q, k_cache, v_cache, 2))).all()


def test_batch_beyond_the_grid_y_cap_is_launched_in_slices(at, monkeypatch):
    """B * Hkv programs sit on CUDA grid axis 1 (cap 65535, none in the interpreter, so
    the cap is lowered): slices of the batch must give the single launch's result."""
    import attnkit.triton._launch as flash

    k_cache, v_cache = _cache(3, 2, 32, 32, seed=9)
    q = torch.randn(3, 4, 2, 32, generator=torch.Generator().manual_seed(10)).to(DEVICE, DTYPE)
    whole = at.decode_attention(q, k_cache, v_cache, 41, return_lse=True, num_splits=3)
    monkeypatch.setattr(flash, "_MAX_GRID_Y", 2)  # one batch row (2 KV heads) per launch
    split = at.decode_attention(q, k_cache, v_cache, 41, return_lse=True, num_splits=3)
    for a, b in zip(whole, split):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "H, Hkv, Tq, lens, options",
    [
        (4, 2, 1, [37, 5, CAPACITY], dict(softcap=3.0)),  # ragged batch, (B,) tensor
        (4, 1, 2, [CAPACITY - 3, 0, 1], dict(sinks=True)),  # an empty row: LSE = sink
        (2, 2, 3, [60, 9, 31], dict(window=(7, None))),  # sliding window of 7 + 1 keys
        (4, 2, 2, 50, dict(window=(12, -1), softcap=5.0, sinks=True)),  # int, all at once
    ],
    ids=["softcap_ragged", "sinks_empty_row", "window_ragged", "all_int_len"],
)
def test_decode_variants_match_the_reference(H, Hkv, Tq, lens, options, at, reference):
    """softcap, sinks, a window and per-row cache lengths: each batch row equals causal
    attention over its own valid part of the cache, by the 2x rule against float64."""
    B, D = 3, 32
    k_cache, v_cache = _cache(B, Hkv, D, D, seed=11)
    for b, n in enumerate(lens if isinstance(lens, list) else [lens] * B):
        k_cache[b, :, n:] = float("nan")  # never read
    q = torch.randn(B, H, Tq, D, generator=torch.Generator().manual_seed(12)).to(DEVICE, DTYPE)
    opts = dict(options)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.linspace(-1.0, 2.0, H, device=DEVICE)
    cache_len = torch.tensor(lens, device=DEVICE) if isinstance(lens, list) else lens
    out, lse = at.decode_attention(q, k_cache, v_cache, cache_len, return_lse=True,
                                   num_splits=3, **opts)
    for b in range(B):
        n = lens[b] if isinstance(lens, list) else lens
        kv = [x[b : b + 1, :, :n] for x in (k_cache, v_cache)]
        ref = reference.float64(q[b : b + 1], *kv, causal=True, **opts)
        base_out, base_lse = reference.baseline(q[b : b + 1], *kv, causal=True, **opts)
        assert_close_by_rule(out[b : b + 1], ref.out, base_out, factor=2, name=f"out[{b}]")
        assert_close_by_rule(lse[b : b + 1], ref.lse, base_lse, factor=2, name=f"lse[{b}]")


def test_decode_rejects_bad_cache_lengths(at):
    k_cache, v_cache = _cache(2, 2, 32, 32, seed=13)
    q = torch.ones(2, 2, 1, 32, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"\(B,\) = \(2,\).*\(3,\)"):
        at.decode_attention(q, k_cache, v_cache, torch.tensor([1, 2, 3], device=DEVICE))
    with pytest.raises(TypeError, match="integer tensor"):
        at.decode_attention(q, k_cache, v_cache, torch.tensor([1.0, 2.0], device=DEVICE))
    with pytest.raises(ValueError, match=r"\(H,\) = \(2,\)"):
        at.decode_attention(q, k_cache, v_cache, 3, sinks=torch.zeros(4, device=DEVICE))
