"""d2l's masked_softmax as the notes copy it (seed 003), and fixed."""

import torch
from torch import nn


def sequence_mask(X, valid_len, value=0):
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value  # writes into X: the caller's scores when X is a view of them
    return X


def masked_softmax_d2l(X, valid_lens):
    """mutates-input (X.reshape is a view) and float16-overflow (-1e6 is -inf in float16);
    a row with valid_len 0 becomes uniform (a fully-masked-row warning)."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


def masked_softmax(X, valid_lens):
    """The fix: a mask, not a write; -inf, not -1e6; a row with no key gives 0."""
    if valid_lens is None:
        return torch.softmax(X, dim=-1)
    if valid_lens.dim() == 1:
        valid_lens = valid_lens[:, None]  # (B, 1): the same length for every query
    keep = torch.arange(X.shape[-1], device=X.device) < valid_lens[..., None]
    scores = X.float().masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0).to(X.dtype)


def masked_softmax_in_place(X, valid_lens):
    """mutates-input, and nothing else: -inf and a guard for empty rows, but written into the
    caller's X."""
    keep = torch.arange(X.shape[-1]) < valid_lens[:, None, None]
    X.masked_fill_(~keep, float("-inf"))
    return torch.softmax(X.float(), dim=-1).nan_to_num(0.0).to(X.dtype)


def masked_softmax_fill_1e6(X, valid_lens):
    """float16-overflow: -1e6 does not fit in float16 (in float32, a row with valid_len 0
    becomes uniform: a fully-masked-row warning)."""
    keep = torch.arange(X.shape[-1]) < valid_lens[:, None, None]
    return torch.softmax(X.masked_fill(~keep, -1e6), dim=-1)
