"""What attnkit keeps between calls never goes stale.

Three things are kept (docs/torch.md, "What is kept between calls"): the checked structure
of a call signature (``attention()``), a KV cache's padding (``KVCache``), and the packed
runs of a mask made by the transformers integration (tested in
tests/integrations/test_transformers_models.py). Each test here changes what a cache
would have to notice (values written through ``.data`` or a shared NumPy array, inference
tensors, ``torch.compile``, a reset or reordered KV cache) and compares with a result
computed from scratch, so a cache keyed on a caller's tensor, or one that outlives what
it describes, fails them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo.testing
from torch.nn import functional as F

import attnkit.torch as at


def _qkv(Tq: int, Tk: int, *, B: int = 2, H: int = 2, D: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, D, generator=g), torch.randn(B, H, Tk, D, generator=g),
            torch.randn(B, H, Tk, D, generator=g))


def _sdpa_with(q, k, v, allowed: torch.Tensor) -> torch.Tensor:
    """The reference: SDPA on an explicit bool mask built by the test."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _key_mask(lengths: list[int], Tk: int) -> torch.Tensor:
    return (torch.arange(Tk) < torch.tensor(lengths)[:, None])[:, None, None, :]


# -- attention(): one checked structure per call signature, never a value ----------------


@pytest.mark.parametrize("Tq", [1, 5])  # a decoding step, a block
def test_valid_lens_written_through_data_reach_the_next_call(Tq):
    q, k, v = _qkv(Tq, 9)
    vl = torch.tensor([9, 4])
    torch.testing.assert_close(at.attention(q, k, v, valid_lens=vl)[0],
                               _sdpa_with(q, k, v, _key_mask([9, 4], 9)))
    vl.data[0] = 2  # no version bump a cache could see
    torch.testing.assert_close(at.attention(q, k, v, valid_lens=vl)[0],
                               _sdpa_with(q, k, v, _key_mask([2, 4], 9)))
    vl.data = torch.tensor([6, 1])  # a new storage under the same tensor object
    torch.testing.assert_close(at.attention(q, k, v, valid_lens=vl)[0],
                               _sdpa_with(q, k, v, _key_mask([6, 1], 9)))


def test_valid_lens_sharing_a_numpy_array_follow_its_writes():
    q, k, v = _qkv(1, 9)
    lengths = np.array([9, 4])
    vl = torch.from_numpy(lengths)  # shares memory: NumPy writes bump nothing in torch
    at.attention(q, k, v, valid_lens=vl)
    lengths[:] = [3, 7]
    torch.testing.assert_close(at.attention(q, k, v, valid_lens=vl)[0],
                               _sdpa_with(q, k, v, _key_mask([3, 7], 9)))


def test_a_mask_written_through_data_reaches_the_next_call():
    q, k, v = _qkv(3, 6)
    mask = torch.ones(3, 6, dtype=torch.bool)
    at.attention(q, k, v, mask=mask, causal=True)
    mask.data[:, :2] = False
    want = _sdpa_with(q, k, v, mask & at.causal_mask(3, 6))
    torch.testing.assert_close(at.attention(q, k, v, mask=mask, causal=True)[0], want)


def test_packed_segment_ids_written_through_data_are_read_again():
    """The packed path reads the documents' runs from the ids in every call: a write
    through ``.data`` moves the documents and the next call follows them."""
    T = 512
    q, k, v = _qkv(T, T, B=1)
    ids = torch.cat([torch.zeros(T // 2), torch.ones(T // 2)]).long()[None]

    def want(ids):
        same = (ids[:, :, None] == ids[:, None, :])[:, None]
        return _sdpa_with(q, k, v, same)

    torch.testing.assert_close(at.attention(q, k, v, segment_ids=ids)[0], want(ids))
    ids.data[0, 100:T // 2] = 1  # the first document now ends at 100
    torch.testing.assert_close(at.attention(q, k, v, segment_ids=ids)[0], want(ids),
                               rtol=1e-5, atol=1e-5)


def test_a_query_reshaped_through_data_is_checked_as_it_is_now():
    q, k, v = _qkv(4, 6)
    assert at.attention(q, k, v)[0].shape == (2, 2, 4, 8)
    q.data = torch.randn(2, 2, 3, 8)
    assert at.attention(q, k, v)[0].shape == (2, 2, 3, 8)
    q.data = torch.randn(2, 2, 3, 5)  # Dk no longer matches k: the check runs again
    with pytest.raises(ValueError, match="Dk"):
        at.attention(q, k, v)


def test_a_known_signature_still_checks_arguments_of_another_type():
    """The signature holds each scalar's type as well as its value (``True == 1`` and
    ``hash(True) == hash(1)``), and each tensor's dtype: nothing slips through on the
    back of an earlier call that passed."""
    q, k, v = _qkv(3, 5)
    at.attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool), window=(1, 0))
    with pytest.raises(TypeError, match="bool"):
        at.attention(q, k, v, mask=torch.ones(3, 5), window=(1, 0))
    with pytest.raises(TypeError, match="window left"):
        at.attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool), window=(True, 0))
    at.attention(q, k, v, scale=1.0)
    with pytest.raises(ValueError, match="scale must be finite"):
        at.attention(q, k, v, scale=float("inf"))


def test_inference_tensors_take_every_cached_path():
    """Inference tensors have no version counter: a cache that read one raised here."""
    q, k, v = _qkv(1, 9)
    with torch.inference_mode():
        vl = torch.tensor([9, 4])
        ids = torch.tensor([[0] * 9, [0] * 5 + [-1] * 4])
        for lengths in ([9, 4], [2, 8]):
            vl[:] = torch.tensor(lengths)  # written in place, inside inference mode
            torch.testing.assert_close(at.attention(q, k, v, valid_lens=vl)[0],
                                       _sdpa_with(q, k, v, _key_mask(lengths, 9)))
        qb, kb, vb = _qkv(9, 9)
        out, _ = at.attention(qb, kb, vb, segment_ids=ids)
    allowed = ((ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] >= 0))[:, None]
    torch.testing.assert_close(out[0], _sdpa_with(qb, kb, vb, allowed)[0])
    torch.testing.assert_close(out[1, :, :5], _sdpa_with(qb, kb, vb, allowed)[1, :, :5])


def test_compiled_calls_read_values_after_eager_calls_cached_the_signature():
    """torch.compile traces the checks (no cache consulted while tracing), with no graph
    break, and the compiled call follows new values as eager mode does."""
    torch._dynamo.reset()
    q, k, v = _qkv(1, 9)
    vl = torch.tensor([9, 4])
    at.attention(q, k, v, valid_lens=vl, causal=True)  # the signature is now known

    def step(q, k, v, vl):
        return at.attention(q, k, v, valid_lens=vl, causal=True)[0]

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    for lengths in ([9, 4], [3, 9]):
        vl.data = torch.tensor(lengths)
        torch.testing.assert_close(compiled(q, k, v, vl),
                                   _sdpa_with(q, k, v, _key_mask(lengths, 9)))
    assert counter.frame_count == 1


# -- KVCache: the padding of a cache is built once and moves with it ----------------------


def _layer():
    torch.manual_seed(0)
    return at.MultiHeadAttention(16, 4, num_kv_heads=2, dtype=torch.float64).eval()


def _tokens(B: int = 2, T: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, T, 16, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


REAL = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])  # row 0 left-padded


def _decode(m, x, real, cache, prompt: int = 5) -> torch.Tensor:
    """A prompt with its padding, then one token per step (real tokens): the outputs."""
    outs = [m(x[:, :prompt], causal=True, cache=cache, padding_mask=real[:, :prompt])[0]]
    outs += [m(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(prompt, x.shape[1])]
    return torch.cat(outs, dim=1)


def test_padded_decoding_equals_one_masked_forward():
    m, x = _layer(), _tokens()
    with torch.no_grad():
        steps = _decode(m, x, REAL, m.init_cache(2, 8))
        full, _ = m(x, causal=True, mask=REAL.bool()[:, None, None, :])
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-12)


def test_reset_forgets_the_padding():
    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    ones = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        _decode(m, _tokens(seed=2), REAL, cache)  # a padded sequence first
        cache.reset()
        got = _decode(m, x, ones, cache)  # then one with no padding at all
        want = _decode(m, x, ones, m.init_cache(2, 8))
        full, _ = m(x, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)


def test_reset_then_a_longer_unpadded_prompt_overwrites_old_padding():
    """Positions once written as padding are real when appended again without any."""
    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :5], causal=True, cache=cache, padding_mask=REAL[:, :5])
        cache.reset()
        got, _ = m(x, causal=True, cache=cache)
        full, _ = m(x, causal=True)
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)


def test_positions_once_padding_are_real_when_appended_again():
    """A right-padded prompt, a reset, then a shorter padded prompt whose decoded tokens
    land where the first prompt's padding was: those tokens are attended."""
    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    right = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0], [1] * 8])
    with torch.no_grad():
        m(_tokens(seed=3), causal=True, cache=cache, padding_mask=right)
        cache.reset()
        got = _decode(m, x, REAL, cache, prompt=4)
        want = _decode(m, x, REAL, m.init_cache(2, 8), prompt=4)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("order", [[1, 0], [0, 0], [1, 1]])
def test_reorder_moves_the_padding_with_the_rows(order):
    """Beam search keeps some rows and drops others: keys, values and padding follow."""
    m, x = _layer(), _tokens()
    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1]])
    idx = torch.tensor(order)
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :5], causal=True, cache=cache, padding_mask=real[:, :5])
        cache.reorder(idx)
        got = torch.cat([m(x[idx, t:t + 1], causal=True, cache=cache)[0] for t in (5, 6, 7)], 1)
        want = _decode(m, x[idx], real[idx], m.init_cache(2, 8))[:, 5:]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_padded_cache_survives_its_state_dict():
    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :5], causal=True, cache=cache, padding_mask=REAL[:, :5])
        restored = m.init_cache(2, 8)
        restored.load_state_dict(cache.state_dict())
        got, _ = m(x[:, 5:6], causal=True, cache=restored)
        want, _ = m(x[:, 5:6], causal=True, cache=cache)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_padded_decoding_in_and_out_of_inference_mode():
    """The padding buffer is made with the cache, so steps may switch between
    ``torch.inference_mode()`` and ``torch.no_grad()``."""
    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    with torch.inference_mode():
        outs = [m(x[:, :5], causal=True, cache=cache, padding_mask=REAL[:, :5])[0]]
    with torch.no_grad():
        outs.append(m(x[:, 5:6], causal=True, cache=cache, padding_mask=REAL[:, 5:6])[0])
    with torch.inference_mode():
        outs += [m(x[:, t:t + 1], causal=True, cache=cache)[0] for t in (6, 7)]
    with torch.no_grad():
        want = _decode(m, x, REAL, m.init_cache(2, 8))
    torch.testing.assert_close(torch.cat(outs, 1), want, rtol=0, atol=0)


def test_padded_decoding_compiles_whole_and_matches_eager():
    torch._dynamo.reset()
    m, x = _layer(), _tokens()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_decode, fullgraph=True, backend=counter)
    with torch.no_grad():
        got = compiled(m, x, REAL, m.init_cache(2, 8))
        want = _decode(m, x, REAL, m.init_cache(2, 8))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1


def test_a_copied_cache_keeps_its_own_padding():
    """Forking a cache (``copy.deepcopy``, as some beam searches do) gives the copy its own
    padding: steps on either follow their own rows, never the other's."""
    import copy

    m, x = _layer(), _tokens()
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :5], causal=True, cache=cache, padding_mask=REAL[:, :5])
        m(x[:, 5:6], causal=True, cache=cache)  # the padding's view is made by now
        fork = copy.deepcopy(cache)
        fork.reorder(torch.tensor([1, 0]))
        got = m(x[[1, 0], 6:7], causal=True, cache=fork)[0]
        mine = m(x[:, 6:7], causal=True, cache=cache)[0]
        want = _decode(m, x, REAL, m.init_cache(2, 8))[:, 6:7]
    torch.testing.assert_close(mine, want, rtol=0, atol=0)
    torch.testing.assert_close(got, want[[1, 0]], rtol=0, atol=0)


def test_the_signature_table_is_bounded(monkeypatch):
    """A loop over ever new shapes (a decoding loop whose Tk grows) cannot grow the table
    past its bound; answers stay right after it is cleared."""
    from attnkit.torch import _signature as functional

    monkeypatch.setattr(functional, "_PREPARED", {})
    monkeypatch.setattr(functional, "_PREPARED_MAX", 8)
    for Tk in range(1, 30):
        q, k, v = _qkv(1, Tk)
        out, _ = at.attention(q, k, v, causal=True)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
        assert len(functional._PREPARED) <= 8
