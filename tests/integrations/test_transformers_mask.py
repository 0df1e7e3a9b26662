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
    ("packed", mu.packed_sequence_compatibility_function(causal, pos, ids), 10, 10, 0, 0,
     None),
    ("packed sliding", mu.packed_sequence_compatibility_function(swin(2), pos, ids), 10, 10,
     0, 0, None),
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
    """No cache: causal is attnkit's causal; decode needs no mask; a static cache's
    offset becomes a band; padding becomes segment ids; nothing builds a dense mask."""
    kw = mask_function(**_args(CASES[0])).attention_kwargs()
    assert kw == {"causal": True}
    kw = mask_function(**_args(CASES[3])).attention_kwargs()
    assert kw.keys() == {"causal", "segment_ids"} and kw["causal"] is True
    kw = mask_function(**_args(CASES[6])).attention_kwargs()  # kpos <= 8 among 16 slots
    assert kw["window"] == (None, -7) and "mask" not in kw
    kw = mask_function(**_args(CASES[7])).attention_kwargs()
    assert kw["causal"] is True and kw["window"] == (2, None)
    kw = mask_function(**_args(CASES[14])).attention_kwargs()
    assert kw["causal"] is True and torch.equal(kw["segment_ids"][0], ids)


def test_unpadded_mask_carries_no_segments():
    got = mask_function(**{**_args(CASES[0]), "attention_mask": torch.ones(B, 6, dtype=torch.bool)})
    assert got.segment_ids is None


def test_masks_without_structure_fall_back_to_dense():
    for fn in (
        mu.chunked_causal_mask_function(3, torch.zeros(B, dtype=torch.long)),
        mu.or_masks(causal, lambda b, h, q, kv: kv == 0),
    ):
        args = dict(batch_size=B, q_length=6, kv_length=6, mask_function=fn,
                    attention_mask=_pad(6, left=1))
        got = mask_function(**args)
        assert type(got) is torch.Tensor and got.dtype == torch.bool
        assert torch.equal(got, mu.sdpa_mask(**args, allow_is_causal_skip=False))


def test_tensor_operations_see_the_dense_mask():
    got = mask_function(**_args(CASES[2]))
    want = got.dense()
    assert "StructuredMask" in repr(got)
    assert torch.equal(got[:, :, :, :4], want[:, :, :, :4])
    assert type(got[:, :, :, :4]) is torch.Tensor
    assert torch.equal(got.to(torch.float32), want.to(torch.float32))
    assert got.contiguous() is got  # what generate() calls on a static-cache mask


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


def test_register_is_idempotent():
    assert register() == NAME == register()
    assert AttentionInterface()[NAME] is attention_forward
    assert mu.AttentionMaskInterface()[NAME] is mask_function


def test_offset_left_on_the_device_becomes_a_band_mask():
    """A static cache on an accelerator keeps its length as a tensor; reading it would
    synchronise, so the band is built from it as a (Tq, Tk) mask instead."""
    host = mask_function(**_args(CASES[6]))
    lazy = StructuredMask(B, 1, 16, offset=torch.tensor(8), lo=host.lo, hi=host.hi,
                          segment_ids=host.segment_ids)
    assert torch.equal(lazy.dense(), host.dense())
    kw = lazy.attention_kwargs()
    assert kw["mask"].shape == (1, 16)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, 2, 1, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(2))
    from attnkit.torch import attention

    torch.testing.assert_close(attention(q, k, v, **kw)[0],
                               attention(q, k, v, **host.attention_kwargs())[0])
