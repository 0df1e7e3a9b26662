"""Where a self-attention module's outputs do not follow a permutation of its tokens, the
check does not compare it with the oracle, and its reason names every cause that does
this, not only rotary embeddings: a learner whose module splits the heads with
``view(B, H, T, d)`` and no transpose (tokens mixed, no position embedding anywhere) was
told the module had rotary or relative position embeddings."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from attnkit.check import check_multi_head  # noqa: E402


class SplitWithoutTranspose(nn.Module):
    """Wrong: the heads split as ``view(B, H, T, d)`` of a ``(B, T, E)`` projection."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = (w(x).view(B, self.h, T, self.d) for w in (self.wq, self.wk, self.wv))
        y = (q @ k.transpose(-1, -2) / math.sqrt(self.d)).softmax(-1) @ v  # (B, H, T, d)
        return self.wo(y.transpose(1, 2).reshape(B, T, E))


def test_the_reason_names_heads_split_without_the_transpose():
    report = check_multi_head(SplitWithoutTranspose)
    assert report.oracle["compared"] is False, report.text()
    why = report.oracle["why"]
    assert "rotary" in why and "view(B, H, T, d) without the transpose" in why, why
    zh = report.text(lang="zh")
    assert "view(B, H, T, d)" in zh and "transpose" in zh, zh
