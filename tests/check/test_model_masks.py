"""The mask ``check_model`` expects, built from model facts, equals the one transformers
builds for the same facts (its public mask functions and ``sdpa_mask``), and the masks an
attention function receives are read as transformers means them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mu = pytest.importorskip("transformers.masking_utils")

from attnkit.check.model.masks import (  # noqa: E402
    CallPlace,
    expected_keep,
    mask_difference,
    received_keep,
)

T = 11


def _padding(kind: str) -> torch.Tensor:
    pad = torch.ones(3, T, dtype=torch.bool)
    if kind == "left":
        pad[1, :3], pad[2, :6] = False, False
    elif kind == "right":
        pad[1, -3:], pad[2, -6:] = False, False
    return pad


def _transformers_mask(fn, pad: torch.Tensor, Tq: int) -> torch.Tensor:
    """``(B, Tq, T)`` from transformers' own ``sdpa_mask``: the last ``Tq`` queries of ``T``
    tokens against all ``T`` keys (a prefill when ``Tq == T``, else a decoding step)."""
    m = mu.sdpa_mask(batch_size=pad.shape[0], q_length=Tq, kv_length=T, q_offset=T - Tq,
                     kv_offset=0, mask_function=fn, attention_mask=pad,
                     allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return m[:, 0]


def _place(pad: torch.Tensor, Tq: int, **kw) -> CallPlace:
    q = torch.arange(T - Tq, T)
    return CallPlace(q_index=q, k_index=torch.arange(T), key_real=pad, query_real=pad[:, q],
                     n_tokens=T, **kw)


@pytest.mark.parametrize("Tq", [T, 3, 1], ids=["prefill", "chunk of 3", "decoding"])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("kind", ["causal", "sliding", "chunked", "bidirectional"])
def test_expected_mask_is_transformers_mask(kind, padding, Tq):
    pad = _padding(padding)
    left = (~pad).long().cumprod(-1).sum(-1)
    fn, kw = {
        "causal": (mu.causal_mask_function, {}),
        "sliding": (mu.sliding_window_causal_mask_function(4), {"window": 4}),
        "chunked": (mu.chunked_causal_mask_function(4, left), {"chunk": 4, "left_pad": left}),
        "bidirectional": (mu.bidirectional_mask_function, {"causal": False}),
    }[kind]
    want = _transformers_mask(fn, pad, Tq)
    real = pad[:, T - Tq:, None]  # padded queries are never compared
    got = expected_keep(_place(pad, Tq, **kw))
    assert torch.equal(got & real, want & real)


def test_packed_documents_are_transformers_packed_mask():
    pos = torch.cat([torch.arange(4), torch.arange(5), torch.arange(2)])[None]
    docs = mu.find_packed_sequence_indices(pos)
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(docs))
    pad = torch.ones(1, T, dtype=torch.bool)
    want = _transformers_mask(fn, pad, T)
    got = expected_keep(_place(pad, T, q_doc=docs, k_doc=docs))
    assert torch.equal(got, want)


def test_received_masks_read_as_transformers_means_them():
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 7, 8)
    causal = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=2)
    module = torch.nn.Module()
    module.is_causal = True
    # an eager-style additive mask: 0 where allowed, the dtype's minimum elsewhere
    additive = torch.zeros(2, 1, 5, 7).masked_fill(~causal, torch.finfo(torch.float32).min)
    keep, bias, words = received_keep(additive, module, {}, q, k)
    assert torch.equal(keep[0, 0], causal) and bias is None and words == "additive float mask"
    keep, _, words = received_keep(causal[None, None], module, {}, q, k)
    assert torch.equal(keep[0, 0], causal) and words == "bool mask"
    # None: causal bottom-right (Tq = 5 of Tk = 7), cut to the sliding window
    keep, _, words = received_keep(None, module, {"sliding_window": 3}, q, k)
    assert torch.equal(keep[0, 0], causal & ~torch.ones(5, 7, dtype=torch.bool).tril(-1))
    assert words == "no mask (is_causal) (sliding_window=3)"
    module.is_causal = False
    assert bool(received_keep(None, module, {}, q, k)[0].all())
    # T5's position_bias and the finite part of an additive mask are the bias
    pb = torch.randn(1, 4, 5, 7)
    _, bias, _ = received_keep(additive + 0.5 * (additive == 0), module, {"position_bias": pb},
                               q, k)
    assert torch.allclose(bias, pb + 0.5 * causal)


def test_mask_difference_names_the_first_query_and_key():
    pad = _padding("left")
    place = _place(pad, T)
    want = expected_keep(place)
    leaky = want.clone()
    leaky[2, 8, 9] = True  # row 2, query 8 may see the future key 9
    leaky[1, 7, 0] = True  # row 1, query 7 may see the padded key 0 (comes first: query 7)
    d = mask_difference(leaky[:, None], want, place)
    assert (d["batch"], d["query"], d["key"], d["allowed"], d["why"]) == (
        1, 7, 0, True, "a padded key")
    assert d["count"] == 2
    leaky[1, 7, 0] = False
    assert mask_difference(leaky[:, None], want, place)["why"] == "a future key"
    hidden = want.clone()
    hidden[0, 5, 2] = False
    d = mask_difference(hidden[:, None], want, place)
    assert (d["batch"], d["query"], d["key"], d["allowed"]) == (0, 5, 2, False)
    # a padded query may hold anything: it is not compared
    other = want.clone()
    other[2, 0, :] = True
    assert mask_difference(other[:, None], want, place) is None


def test_a_flex_attention_block_mask_is_read_element_by_element():
    fa = pytest.importorskip("torch.nn.attention.flex_attention")

    def window_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + 2) & (q_idx + 2 - kv_idx < 3)

    block = fa.create_block_mask(window_causal, B=2, H=None, Q_LEN=5, KV_LEN=7, device="cpu",
                                 _compile=False)
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 7, 8)
    keep, bias, words = received_keep(block, torch.nn.Module(), {}, q, k)
    i, j = torch.arange(5)[:, None] + 2, torch.arange(7)[None, :]
    assert torch.equal(keep[1, 0], (j <= i) & (i - j < 3)) and bias is None
    assert words == "FlexAttention BlockMask"
