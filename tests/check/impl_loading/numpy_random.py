"""A NumPy multi-head class whose dropout is always on (NumPy has no eval())."""

from __future__ import annotations

import numpy as np


class DropoutAlways:
    def __init__(self, embed_dim, num_heads, dropout=0.1):
        rng = np.random.default_rng(0)
        self.h, self.p = num_heads, 0.1  # the probability is fixed, whatever is passed
        self.w = [rng.standard_normal((embed_dim, embed_dim)) / np.sqrt(embed_dim)
                  for _ in range(4)]

    def __call__(self, query, key, value):
        B, Tq, E = query.shape
        d = E // self.h

        def heads(x, w):
            return (x @ w).reshape(B, x.shape[1], self.h, d).transpose(0, 2, 1, 3)

        q, k, v = heads(query, self.w[0]), heads(key, self.w[1]), heads(value, self.w[2])
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        e = np.exp(s - s.max(-1, keepdims=True))
        w = e / e.sum(-1, keepdims=True)
        w = w * (np.random.random(w.shape) >= self.p) / (1 - self.p)
        return (w @ v).transpose(0, 2, 1, 3).reshape(B, Tq, E) @ self.w[3]
