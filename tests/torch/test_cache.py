"""KV cache: decoding in any split equals one full causal forward; overflow, save/restore,
reset, cross-attention."""

from __future__ import annotations

import io

import pytest
import torch

import attnkit
import attnkit.torch as at
from attnkit.torch import KVCache

SPLITS = [[11], [4, 1, 1, 1, 1, 1, 1, 1], [1] * 11, [3, 5, 2, 1], [1, 10]]


def _model(**kw) -> at.MultiHeadAttention:
    torch.manual_seed(0)
    return at.MultiHeadAttention(12, 4, num_kv_heads=2, dtype=torch.float64, **kw).eval()


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("window", [None, (3, 0)])
def test_decode_in_any_split_equals_full_causal(split, window):
    m = _model()
    x = torch.randn(2, sum(split), 12, dtype=torch.float64)
    full, _ = m(x, causal=True, window=window)
    cache = m.init_cache(2, 16)
    outs, t = [], 0
    with torch.no_grad():
        for n in split:
            out, _ = m(x[:, t:t + n], causal=True, window=window, cache=cache)
            outs.append(out)
            t += n
    assert cache.length == sum(split)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-13)


def test_cache_layout_and_weights():
    m = _model(head_dim=5, v_head_dim=3)
    cache = m.init_cache(2, 9)
    assert cache.k.shape == (2, 2, 9, 5) and cache.v.shape == (2, 2, 9, 3)
    assert cache.k.dtype == torch.float64 and isinstance(cache.length, int)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    with torch.no_grad():
        m(x[:, :4], causal=True, cache=cache)
        _, w = m(x[:, 4:], causal=True, cache=cache, need_weights=True)
        _, w_full = m(x, causal=True, need_weights=True)
    torch.testing.assert_close(w, w_full[:, 4:], rtol=1e-12, atol=1e-13)
    k_full = m.k_proj(x).view(2, 6, 2, 5).transpose(1, 2)
    torch.testing.assert_close(cache.k[:, :, :6], k_full.detach(), rtol=1e-13, atol=1e-14)


def test_overflow_raises_and_leaves_cache_intact():
    m = _model()
    x = torch.randn(1, 8, 12, dtype=torch.float64)
    cache = m.init_cache(1, 6)
    with torch.no_grad():
        m(x[:, :5], causal=True, cache=cache)
        k_before, v_before = cache.k.clone(), cache.v.clone()
        with pytest.raises(ValueError, match=r"5 positions filled \+ 2 new > capacity 6"):
            m(x[:, 5:7], causal=True, cache=cache)
        assert cache.length == 5
        assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
        out, _ = m(x[:, 5:6], causal=True, cache=cache)  # still usable, still right
    full, _ = m(x[:, :6], causal=True)
    torch.testing.assert_close(out, full[:, 5:], rtol=1e-12, atol=1e-13)


def test_save_restore_and_reset():
    m = _model()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    full, _ = m(x, causal=True)
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        m(x[:, :4], causal=True, cache=cache)
    buf = io.BytesIO()
    torch.save(cache.state_dict(), buf)
    buf.seek(0)
    restored = m.init_cache(2, 8)
    restored.load_state_dict(torch.load(buf))
    assert restored.length == 4
    with torch.no_grad():
        cache.reset()  # the original is reused for something else meanwhile
        assert cache.length == 0
        m(torch.randn(2, 3, 12, dtype=torch.float64), causal=True, cache=cache)
        out, _ = m(x[:, 4:], causal=True, cache=restored)
        torch.testing.assert_close(out, full[:, 4:], rtol=1e-12, atol=1e-13)
        cache.reset()
        out, _ = m(x, causal=True, cache=cache)  # after reset: a fresh sequence
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-13)


def test_restore_checks_shapes():
    m = _model()
    small = m.init_cache(2, 4)
    with pytest.raises(RuntimeError, match="size mismatch"):
        small.load_state_dict(m.init_cache(2, 8).state_dict())


def test_cross_attention_cache_projects_memory_once():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(8, 2, kdim=6, vdim=6, dtype=torch.float64).eval()
    memory = torch.randn(2, 9, 6, dtype=torch.float64)
    y = torch.randn(2, 5, 8, dtype=torch.float64)
    vl = torch.tensor([9, 4])
    full, _ = m(y, memory, valid_lens=vl)
    calls = []
    m.k_proj.register_forward_hook(lambda *a: calls.append("k"))
    m.v_proj.register_forward_hook(lambda *a: calls.append("v"))
    cache = m.init_cache(2, 9, cross=True)
    outs = []
    with torch.no_grad():
        for t in range(5):
            key = memory if t == 0 else (memory if t % 2 else None)  # later: optional
            outs.append(m(y[:, t:t + 1], key, valid_lens=vl, cache=cache)[0])
    assert calls == ["k", "v"] and cache.length == 9 and cache.cross
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match=r"\(B, Tk\) = \(2, 9\)"):
        m(y[:, :1], memory[:, :4], cache=cache)


def test_cache_errors():
    m = _model()
    with pytest.raises(ValueError, match=r"does not match this layer"):
        m(torch.randn(3, 1, 12, dtype=torch.float64), cache=m.init_cache(2, 4))
    with pytest.raises(ValueError, match="needs `key`"):
        m(torch.randn(2, 1, 12, dtype=torch.float64), cache=m.init_cache(2, 4, cross=True))
    cache = at.KVCache(batch_size=1, num_kv_heads=2, capacity=4, head_dim=3)
    with pytest.raises(ValueError, match=r"\(1, 2, T, 3\).*got k \(1, 2, 2, 4\)"):
        cache.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 3))


def test_decode_hands_cache_buffers_to_triton_kernel_in_place(monkeypatch):
    """Wiring check without a GPU: with the Triton decode kernel reported usable, the layer
    passes the cache's own buffers and filled length to it (a stand-in computes the
    reference from those buffers, so a wrong length or layout changes the output)."""
    import sys
    import types

    from attnkit.torch import _triton_path as tp

    seen = []

    def decode_attention(q, k_cache, v_cache, cache_len, *, scale=None, return_lse=False):
        seen.append((k_cache.data_ptr(), v_cache.data_ptr(), cache_len, scale))
        out, _ = at.attention(q, k_cache[:, :, :cache_len], v_cache[:, :, :cache_len],
                              causal=True, scale=scale, backend="math")
        return out

    fake = types.ModuleType("attnkit.triton")
    fake.is_available = lambda: True
    fake.decode_attention = decode_attention
    monkeypatch.setitem(sys.modules, "attnkit.triton", fake)
    # `import attnkit.triton as x` reads the package attribute when the real one is loaded
    monkeypatch.setattr(attnkit, "triton", fake, raising=False)
    m = _model()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    full, _ = m(x, causal=True)
    monkeypatch.setattr(tp, "triton_reason", lambda *a: None)
    cache = m.init_cache(2, 8)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with torch.no_grad():
        outs = [m(x[:, :3], causal=True, cache=cache)[0]]
        outs += [m(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(3, 6)]
    assert [s[2] for s in seen] == [3, 4, 5, 6]
    assert all(s[0] == cache.k.data_ptr() and s[1] == cache.v.data_ptr() for s in seen)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("cross", [False, True])
def test_failing_forward_leaves_cache_unchanged(cross):
    """A forward that raises after the append (a bad mask, valid_lens out of range) must not
    leave this call's keys in the cache: a retry would otherwise attend to them twice."""
    m = _model()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    cache = m.init_cache(2, 8, cross=cross)
    key = x if cross else None
    bad = [
        {"mask": torch.ones(3, 5, dtype=torch.bool)},
        {"valid_lens": torch.tensor([11, 2])},
    ]
    with torch.no_grad():
        for kw in bad:
            with pytest.raises(ValueError, match="valid_lens must lie|not broadcastable"):
                m(x[:, :3], key, causal=not cross, cache=cache, **kw)
            assert cache.length == 0
        out, _ = m(x[:, :3], key, causal=not cross, cache=cache)
    full, _ = m(x[:, :3], key, causal=not cross)
    assert cache.length == (6 if cross else 3)
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-13)




def test_an_older_state_dict_with_the_nonfinite_buffer_loads_with_a_warning():
    """Caches used to keep a `nonfinite` buffer (codes of NaN/inf written into them); an
    old state_dict still loads, with one DeprecationWarning, and the buffer is gone."""
    cache = KVCache(batch_size=2, num_kv_heads=1, capacity=4, head_dim=3)
    cache.append(torch.ones(2, 1, 3, 3), torch.ones(2, 1, 3, 3))
    old = cache.state_dict()
    old["nonfinite"] = torch.zeros(2, 1, 2, 4)
    fresh = KVCache(batch_size=2, num_kv_heads=1, capacity=4, head_dim=3)
    with pytest.warns(DeprecationWarning, match="nonfinite") as caught:
        fresh.load_state_dict(old)
    assert len(caught) == 1 and fresh.length == 3 and torch.equal(fresh.k, cache.k)
    assert "nonfinite" not in fresh.state_dict()


def test_padding_and_reorder_errors_name_the_callers_shapes():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(12, 2, dtype=torch.float64)
    x = torch.randn(2, 3, 12, dtype=torch.float64)
    cache = m.init_cache(2, 8)
    with pytest.raises(ValueError, match=r"padding_mask covers.*\(2, 3\); got \(2, 4\)"):
        m(x, cache=cache, padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="padding_mask must be a bool or 0/1"):
        m(x, cache=cache, padding_mask=torch.ones(2, 3))
    assert cache.length == 0  # a refused call appends nothing
    with pytest.raises(ValueError, match=r"reorder takes a \(2,\) integer tensor.*\(3,\)"):
        cache.reorder(torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="reorder takes"):
        cache.reorder(torch.tensor([0.0, 1.0]))


def test_padding_mask_without_a_cache_is_a_key_mask():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(12, 2, dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    real = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    got, _ = m(x, causal=True, padding_mask=real)
    want, _ = m(x, causal=True, mask=real.bool()[:, None, None, :])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
