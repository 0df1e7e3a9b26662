"""Attention functions with planted faults, registered with transformers'
``AttentionInterface`` the way people register their own kernels (look-alikes written for
these tests). Each is right on most calls and wrong on some: ``check_model`` must find it
at the right layer, step and query."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def _sdpa(query, key, value, mask, scaling):
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def top_left_causal(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    **kwargs):
    """Builds its own causal mask with ``tril`` over (Tq, Tk): aligned top-left, so right
    while Tq == Tk (the prefill) and wrong when decoding with a cache (Tq = 1 < Tk)."""
    Tq, Tk = query.shape[-2], key.shape[-2]
    causal = torch.ones(Tq, Tk, dtype=torch.bool).tril()
    mask = causal if attention_mask is None else attention_mask & causal
    return _sdpa(query, key, value, mask, scaling)


def fill_minus_1e9(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                   **kwargs):
    """Plain math with ``masked_fill(~mask, -1e9)``: fine in float32, and -1e9 does not
    fit in float16."""
    G = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(G, 1), value.repeat_interleave(G, 1)
    scores = query @ key.transpose(-1, -2) * scaling
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, -1e9)
    out = scores.softmax(-1) @ value
    return out.transpose(1, 2).contiguous(), None


def flips_mask_on_layer_1(module, query, key, value, attention_mask, scaling=None,
                          dropout=0.0, **kwargs):
    """Reads the bool mask the other way round, on layer 1 only."""
    mask = attention_mask
    if module.layer_idx == 1 and mask is not None:
        mask = ~mask
    return _sdpa(query, key, value, mask, scaling)


def ignores_sliding_window(module, query, key, value, attention_mask, scaling=None,
                           dropout=0.0, sliding_window=None, **kwargs):
    """A flash-style function (no mask: it builds causal itself, bottom-right) that never
    looks at ``sliding_window``."""
    Tq, Tk = query.shape[-2], key.shape[-2]
    causal = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    return _sdpa(query, key, value, causal, scaling)


def register_faults() -> None:
    """Register the four under their own names; the ones that read a dense bool mask get
    transformers' SDPA mask function, the others none (they receive ``mask=None``)."""
    AttentionInterface.register("fault-top-left", top_left_causal)
    AttentionInterface.register("fault-fill-1e9", fill_minus_1e9)
    AttentionMaskInterface.register("fault-fill-1e9", sdpa_mask)
    AttentionInterface.register("fault-flip-layer-1", flips_mask_on_layer_1)
    AttentionMaskInterface.register("fault-flip-layer-1", sdpa_mask)
    AttentionInterface.register("fault-no-window", ignores_sliding_window)


def fill_minus_inf_no_guard(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, **kwargs):
    """Plain math with ``-inf`` fills and no guard for a row with no allowed key: NaN on
    left-padded queries, which reaches the next layer through the padded tokens."""
    G = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(G, 1), value.repeat_interleave(G, 1)
    scores = (query @ key.transpose(-1, -2) * scaling).masked_fill(~attention_mask, -torch.inf)
    out = scores.softmax(-1) @ value
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("fault-nan-rows", fill_minus_inf_no_guard)
AttentionMaskInterface.register("fault-nan-rows", sdpa_mask)


def ignores_the_causal_mask(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, **kwargs):
    """Registered without a mask function (it receives ``mask=None`` and should read
    ``module.is_causal``): it never does, so every query sees the keys after it."""
    return _sdpa(query, key, value, attention_mask, scaling)


def ignores_the_padding(module, query, key, value, attention_mask, scaling=None,
                        dropout=0.0, **kwargs):
    """Given transformers' bool mask, it only takes the causal part of it (``is_causal``
    on the full length): right without padding, and padded keys get weight."""
    Tq, Tk = query.shape[-2], key.shape[-2]
    causal = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    return _sdpa(query, key, value, causal, scaling)


def rounds_through_float8(module, query, key, value, attention_mask, scaling=None,
                          dropout=0.0, **kwargs):
    """SDPA with its output stored in 8-bit floats on the way out (a 'fast path' that keeps
    too few bits): far beyond the error of plain half-precision math."""
    out, _ = _sdpa(query, key, value, attention_mask, scaling)
    return out.to(torch.float8_e4m3fn).to(query.dtype), None


AttentionInterface.register("fault-no-causal", ignores_the_causal_mask)
AttentionInterface.register("fault-no-padding", ignores_the_padding)
AttentionMaskInterface.register("fault-no-padding", sdpa_mask)
AttentionInterface.register("fault-float8", rounds_through_float8)
AttentionMaskInterface.register("fault-float8", sdpa_mask)
AttentionInterface.register("fault-top-left-masked", top_left_causal)
AttentionMaskInterface.register("fault-top-left-masked", sdpa_mask)
