"""Multi-head attention as a NumPy class: attnkit's reference, and the seed-002 softmax."""

import numpy as np

from attnkit.numpy import MultiHeadParams, multi_head_attention


class MultiHead:
    """attnkit.numpy's multi-head attention; mask True = may attend."""

    def __init__(self, embed_dim, num_heads):
        self.params = MultiHeadParams.init(embed_dim, num_heads, rng=np.random.default_rng(0))

    def __call__(self, query, key, value, mask=None):
        return multi_head_attention(self.params, query, key, value, mask=mask)


class NaiveSoftmax(MultiHead):
    """nan-or-inf: seed 002's softmax, exp() without the max trick."""

    def __call__(self, query, key, value):
        p, (B, Tq, _) = self.params, query.shape
        q = np.einsum("bte,hed->bhtd", query, p.w_q)
        k = np.einsum("bte,hed->bhtd", key, p.w_k)
        v = np.einsum("bte,hed->bhtd", value, p.w_v)
        e = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
        heads = (e / e.sum(-1, keepdims=True)) @ v  # (B, H, Tq, Dv)
        return np.swapaxes(heads, 1, 2).reshape(B, Tq, -1) @ p.w_o
