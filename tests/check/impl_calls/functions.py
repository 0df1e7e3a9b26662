"""Attention functions written the way people write them, for tests/check/test_calls.py.

Each is a look-alike of a pattern (written here, not copied): a flag after q/k/v, inputs
that must go by name, a masked softmax in either polarity, an additive float mask with the
output laid out (B, Tq, H, Dv), a function that is causal by itself.
"""

import math

import numpy as np
import torch


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_retain(Q, K, V, retain_derived=True):
    """A layer's forward that keeps its intermediates when asked: the flag is no mask."""
    w = _softmax(Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1]))
    if retain_derived:
        attention_retain.cache = w.shape
    return w @ V


def attention_scale_flag(q, k, v, scale=True):
    """A bool 'scale' switch after q/k/v (True: divide by sqrt(d))."""
    s = q @ np.swapaxes(k, -1, -2)
    if scale:
        s = s / np.sqrt(q.shape[-1])
    return _softmax(s) @ v


def attention_dropout_args(q, k, v, dropout=0.1, training=False):
    """Dropout that only acts while training, both knobs after q/k/v."""
    w = _softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    if training and dropout:
        w = w * (np.random.default_rng().random(w.shape) > dropout) / (1 - dropout)
    return w @ v


def attention_keyword_only(*, query, key, value, mask=None):
    """Keyword-only arguments: nothing can be passed by position. mask: True = may attend."""
    s = query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0) @ value


def attention_value_first(value, key, query):
    """The inputs in another order than q, k, v: only their names say which is which."""
    return _softmax(query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])) @ value


def _masked_softmax(x, ignore):
    s = np.where(ignore, -np.inf, x)
    m = s.max(-1, keepdims=True)
    e = np.where(ignore, 0.0, np.exp(s - np.where(np.isfinite(m), m, 0)))
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)


def masked_softmax_keep(x, mask):
    """A correct masked softmax whose mask means True = may attend."""
    return _masked_softmax(x, ~mask)


def masked_softmax_masked(x, mask):
    """A correct masked softmax whose mask means True = masked out."""
    return _masked_softmax(x, mask)


def masked_softmax_keep_inverted(x, mask):
    """Bug: documented (and declared) as True = may attend, it ignores the True keys."""
    return _masked_softmax(x, mask)


def eager_like(query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """A look-alike of a library's eager path: (B, H, T, D) in, an additive float mask
    (0 or finfo.min) added to the scores, a required scaling, and the output returned as
    (B, Tq, H, Dv) with the weights."""
    scores = query @ key.transpose(-2, -1) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=False)
    out = weights @ value
    return out.transpose(1, 2).contiguous(), weights


def eager_like_unscaled(query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Bug: the same, ignoring the scaling it is given."""
    scores = query @ key.transpose(-2, -1)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def causal_attention(q, k, v):
    """Causal by itself: query i sees keys j <= i + Tk - Tq."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    future = ~np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)
    return _masked_softmax(s, future) @ v


def causal_attention_mask_removed(q, k, v):
    """Bug: meant causal, the mask line was lost."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax(s) @ v


def needs_config(config, query, key, value, attention_mask):
    """Takes a config object first: the check cannot fill it."""
    return _softmax(query @ np.swapaxes(key, -1, -2) * config.scaling) @ value


def eager_like_with_module(module, query, key, value, attention_mask, scaling, dropout=0.0,
                           **kwargs):
    """The calling layer first (read for its training flag and its key/value head groups),
    then the inputs: they can only go by name."""
    groups = module.num_key_value_groups
    key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    scores = query @ key.transpose(-2, -1) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def torch_keep_softmax(x, mask):
    """PyTorch, True = may attend; written with masked_fill (a fully masked row gives 0)."""
    s = x.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


_ = math


class LayerWithForward:
    """A NumPy library's layer: forward(), no __call__, a flag after the inputs."""

    def __init__(self):
        self.derived = []

    def forward(self, Q, K, V, retain_derived=True):
        w = _softmax(Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1]))
        if retain_derived:
            self.derived.append(w)
        return w @ V


layer = LayerWithForward()
