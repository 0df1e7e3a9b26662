"""A custom attention kernel registered with transformers' ``AttentionInterface`` that reads
what it needs off the calling module (``module.sinks``, ``module.scaling``), the way
kernels written for GPT-OSS do, with the scale dropped (a look-alike written for these
tests)."""

from __future__ import annotations

import torch


def sinks_from_module_unscaled(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, **kwargs):
    """Attention with sinks read from ``module.sinks``; the scores are never scaled."""
    G = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(G, 1), value.repeat_interleave(G, 1)
    scores = query @ key.transpose(-1, -2)  # planted: no * scaling
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    B, H, Tq, _ = scores.shape
    sink = module.sinks.reshape(1, H, 1, 1).expand(B, H, Tq, 1).to(scores.dtype)
    probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    return (probs @ value).transpose(1, 2).contiguous(), None
