"""The mask function hands attnkit structure that means what transformers' dense mask means.

Every case calls :func:`attnkit.integrations.transformers.mask_function` and
transformers' own ``sdpa_mask`` with the same arguments (what ``create_causal_mask`` and
friends pass for no cache, a dynamic cache, a sliding-window cache and a static cache),
then checks that (1) the structure evaluates to the same dense mask, and (2) attention run
with the structure's keyword arguments equals attention run with the dense mask.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "transformers", reason="the transformers integration needs `pip install attnkit[transformers]`"
)

from transformers import AttentionInterface  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

import attnkit.torch as at  # noqa: E402
from attnkit.integrations.transformers import (  # noqa: E402
    NAME,
    StructuredMask,
    attention_forward,
    mask_function,
    register,
)

B = 2


def _pad(n: int, left: int = 0, right: int = 0) -> torch.Tensor:
    """``(B, n)`` 2-D mask; row 1 has ``left`` pads in front and ``right`` at the end."""
    m = torch.ones(B, n, dtype=torch.bool)
    m[1, :left] = False
    if right:
        m[1, n - right:] = False
    return m


def _packed(*lengths: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.cat([torch.arange(n) for n in lengths]).expand(B, -1)
    return pos, mu.find_packed_sequence_indices(pos)


def _packed_mask(fn, pos: torch.Tensor, ids: torch.Tensor):
    """What ``create_causal_mask`` hands the mask interface for packed sequences (from 5.23
    positions are remapped per document first; before, the band is applied as is)."""
    remap = getattr(mu, "remap_positions_for_packed_sequence", None)
    inner = remap(fn, pos) if remap is not None else fn
    return mu.and_masks(inner, mu.packed_sequence_mask_function(ids))


causal, bidir = mu.causal_mask_function, mu.bidirectional_mask_function
swin = mu.sliding_window_causal_mask_function
pos, ids = _packed(3, 5, 2)

# (name, mask_function, q_length, kv_length, q_offset, kv_offset, 2-D mask)
CASES = [
    ("causal", causal, 6, 6, 0, 0, None),
    ("causal right pad", causal, 6, 6, 0, 0, _pad(6, right=2)),
    ("causal left pad", causal, 6, 6, 0, 0, _pad(6, left=3)),
    ("decode, dynamic cache", causal, 1, 9, 8, 0, _pad(9, left=3)),
    ("chunked prefill", causal, 3, 9, 6, 0, _pad(9, left=2)),
    ("static cache prefill", causal, 5, 16, torch.tensor(0), 0, _pad(5, left=2)),
    ("static cache decode", causal, 1, 16, torch.tensor(8), 0, _pad(9, left=2)),
    ("sliding window", swin(3), 7, 7, 0, 0, _pad(7, left=2)),
    ("sliding, full dynamic cache", swin(3), 1, 3, 9, 7, _pad(10, left=2)),
    ("sliding, filling cache", swin(4), 2, 4, 2, 0, _pad(4, left=1)),
    ("sliding, static cache", swin(4), 1, 4, torch.tensor(9), 6, _pad(10, left=2)),
    ("bidirectional", bidir, 6, 6, 0, 0, _pad(6, right=2)),
    ("cross-attention", bidir, 3, 7, 0, 0, _pad(7, right=3)),
    ("bidirectional window", mu.sliding_window_bidirectional_mask_function(2), 7, 7, 0, 0,
     _pad(7, right=1)),
    ("packed", _packed_mask(causal, pos, ids), 10, 10, 0, 0, None),
    ("packed sliding", _packed_mask(swin(2), pos, ids), 10, 10, 0, 0, None),
]


def _args(case):
    _, fn, q, kv, q_off, kv_off, pad = case
    return dict(batch_size=B, q_length=q, kv_length=kv, q_offset=q_off, kv_offset=kv_off,
                mask_function=fn, attention_mask=pad)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_structure_means_the_dense_mask(case):
    got = mask_function(**_args(case))
    want = mu.sdpa_mask(**_args(case), allow_is_causal_skip=False)
    assert isinstance(got, StructuredMask), f"{case[0]} fell back to a dense mask"
    assert got.shape == want.shape
    assert torch.equal(got.dense(), want), f"{case[0]}: {got!r}"

    # Attention with the structure's keywords == attention with the dense mask.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 4, case[2], 8, generator=g, dtype=torch.float64)
    k = torch.randn(B, 2, case[3], 8, generator=g, dtype=torch.float64)
    v = torch.randn(B, 2, case[3], 8, generator=g, dtype=torch.float64)
    from attnkit.torch import attention

    out, w = attention(q, k, v, **got.attention_kwargs(), need_weights=True)
    ref, ref_w = at.attention(q, k, v, mask=want, need_weights=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-12)


def test_structure_reaches_attnkit_keywords():
    """No cache: causal is attnkit's causal; decode needs no band; a static cache's
    offset becomes a band; padding becomes a key mask (B, 1, 1, Tk); packed sequences
    become segment ids; nothing builds a dense (Tq, Tk) mask."""
    kw = mask_function(**_args(CASES[0])).attention_kwargs()
    assert kw == {"causal": True}
    kw = mask_function(**_args(CASES[3])).attention_kwargs()
    assert kw.keys() == {"causal", "mask"} and kw["causal"] is True
    assert kw["mask"].shape == (B, 1, 1, 9)
    kw = mask_function(**_args(CASES[6])).attention_kwargs()  # kpos <= 8 among 16 slots
    assert kw["window"] == (None, -7) and kw["mask"].shape == (B, 1, 1, 16)  # keys only
    kw = mask_function(**_args(CASES[7])).attention_kwargs()
    assert kw["causal"] is True and kw["window"] == (2, None)
    kw = mask_function(**_args(CASES[14])).attention_kwargs()
    q_ids, kv_ids = kw["segment_ids"]  # one pair for every layer: its runs are read once
    assert kw["causal"] is True and torch.equal(q_ids, ids) and kv_ids is q_ids


def test_unpadded_mask_carries_no_padding():
    got = mask_function(**{**_args(CASES[0]), "attention_mask": torch.ones(B, 6, dtype=torch.bool)})
    assert got.key_valid is None and got.segments is None


def test_masks_without_structure_fall_back_to_dense_and_warn_once(monkeypatch):
    import attnkit.integrations._transformers_mask as tm

    for fn in (
        mu.or_masks(causal, lambda b, h, q, kv: kv == 5),  # every query sees key 5
        mu.or_masks(causal, lambda b, h, q, kv: kv < 3),  # a prefix seen by every query
    ):
        args = dict(batch_size=B, q_length=6, kv_length=6, mask_function=fn,
                    attention_mask=_pad(6, left=1))
        monkeypatch.setattr(tm, "_warned", set())
        with pytest.warns(RuntimeWarning, match="not a band"):
            got = mask_function(**args)
        assert type(got) is torch.Tensor and got.dtype == torch.bool
        assert torch.equal(got, mu.sdpa_mask(**args, allow_is_causal_skip=False))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second time: no warning
            mask_function(**args)


def test_the_mask_refuses_tensor_operations():
    """A model that uses the mask itself instead of handing it to AttentionInterface (T5 in
    transformers 5.4-5.12 added it to its position bias, where True counted as +1) gets a
    clear error at its first forward, not a silently wrong mask."""
    got = mask_function(**_args(CASES[2]))
    assert "StructuredMask" in repr(got)
    position_bias = torch.zeros(B, 4, 6, 6)
    with pytest.raises(RuntimeError, match="outside transformers' AttentionInterface"):
        position_bias + got
    with pytest.raises(RuntimeError, match="sdpa"):
        got[:, :, :, :4]
    assert got.contiguous() is got  # what generate() calls on a static-cache mask
    assert got.ndim == 4 and got.dtype == torch.bool  # metadata stays readable


def test_dense_float_and_missing_masks_in_the_attention_function():
    class Module(torch.nn.Module):
        is_causal = True

    mod = Module().eval()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 1, 5, 5, generator=g, dtype=torch.float64)
    out, _ = attention_forward(mod, q, k, v, bias)
    ref, _ = at.attention(q, k, v, bias=bias)
    torch.testing.assert_close(out, ref.transpose(1, 2))
    out, _ = attention_forward(mod, q, k, v, None)  # None: causal, as SDPA's integration
    ref, _ = at.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, ref.transpose(1, 2))


def test_chunked_attention_reads_as_packed_sequences():
    """Checked exactly against the dense mask: with no padding, each chunk of a chunked
    causal mask is a packed sequence."""
    args = dict(batch_size=B, q_length=7, kv_length=7,
                mask_function=mu.chunked_causal_mask_function(3, torch.zeros(B, dtype=torch.long)))
    got = mask_function(**args)
    assert isinstance(got, StructuredMask)
    assert torch.equal(got.segments[0], torch.tensor([0, 0, 0, 1, 1, 1, 2]))
    assert torch.equal(got.dense(), mu.sdpa_mask(**args, allow_is_causal_skip=False))


def test_register_is_idempotent():
    assert register() == NAME == register()
    assert AttentionInterface()[NAME] is attention_forward
    assert mu.AttentionMaskInterface()[NAME] is mask_function


def test_offset_left_on_the_device_becomes_a_band_mask():
    """A static cache on an accelerator keeps its length as a tensor; reading it would
    synchronise, so the band is built from it as a (Tq, Tk) mask instead."""
    host = mask_function(**_args(CASES[6]))
    lazy = StructuredMask(B, 1, 16, offset=torch.tensor(8), lo=host.lo, hi=host.hi,
                          key_valid=host.key_valid)
    assert torch.equal(lazy.dense(), host.dense())
    kw = lazy.attention_kwargs()
    assert kw["mask"].shape == (B, 1, 1, 16)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, 2, 1, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(2))
    from attnkit.torch import attention

    torch.testing.assert_close(attention(q, k, v, **kw)[0],
                               attention(q, k, v, **host.attention_kwargs())[0])


def test_no_mask_reads_what_flash_kernels_get():
    """With no mask, structure comes from the keywords transformers hands its flash-attention
    kernels: ``is_causal``, ``sliding_window``, and packed input as ``position_ids`` or
    ``cu_seq_lens_q/k`` (one flattened row)."""

    class Module(torch.nn.Module):
        is_causal = True

    mod = Module().eval()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pos, ids = _packed(3, 5, 2)
    want = at.attention(q, k, v, causal=True, segment_ids=ids[:1])[0].transpose(1, 2)
    out, _ = attention_forward(mod, q, k, v, None, position_ids=pos[:1])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    cu = torch.tensor([0, 3, 8, 10])
    out, _ = attention_forward(mod, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                               max_length_q=5, max_length_k=5)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # transformers' window w: key j seen by query i iff i - w < j <= i
    out, _ = attention_forward(mod, q, k, v, None, sliding_window=3)
    dense = mu.sdpa_mask(batch_size=1, q_length=10, kv_length=10, mask_function=swin(3),
                         allow_is_causal_skip=False)
    torch.testing.assert_close(out, at.attention(q, k, v, mask=dense)[0].transpose(1, 2),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("Tq", [1, 3])
def test_no_mask_window_is_aligned_with_the_last_key(Tq):
    """With no mask, a query block shorter than the keys (a cache) is the last Tq positions,
    as in flash-attention: causal and window both end at the last key, and a single query
    still gets its window."""

    class Module(torch.nn.Module):
        is_causal = True

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, Tq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 10, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out, _ = attention_forward(Module().eval(), q, k, v, None, sliding_window=4)
    dense = mu.sdpa_mask(batch_size=1, q_length=Tq, kv_length=10, q_offset=10 - Tq,
                         mask_function=swin(4), allow_is_causal_skip=False)
    want = at.attention(q, k, v, mask=dense)[0].transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert out.abs().sum() > 0
