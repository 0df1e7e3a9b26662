"""Where a self-attention module's outputs do not follow a permutation of its tokens and no
reading explains them, the check does not compare it with the oracle, and its reason names
every cause that does this, not only rotary embeddings: a learner whose module splits the
heads with ``view(B, H, T, d)`` and no transpose (tokens mixed, no position embedding
anywhere) was told the module had rotary or relative position embeddings. The split alone
is now read and found (``mixes-queries``); with a position-dependent term on top it is
not, and the reason still names it."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from attnkit.check import check_multi_head  # noqa: E402


class SplitWithoutTranspose(nn.Module):
    """Wrong: the heads split as ``view(B, H, T, d)`` of a ``(B, T, E)`` projection."""

    def __init__(self, d_model: int, n_heads: int, slope: float = 0.0) -> None:
        super().__init__()
        self.h, self.d, self.slope = n_heads, d_model // n_heads, slope
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = (w(x).view(B, self.h, T, self.d) for w in (self.wq, self.wk, self.wv))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        pos = torch.arange(T, dtype=x.dtype)
        s = s - self.slope * (pos[:, None] - pos[None, :]).abs()  # a distance bias (ALiBi)
        y = s.softmax(-1) @ v  # (B, H, T, d)
        return self.wo(y.transpose(1, 2).reshape(B, T, E))


def test_heads_split_without_the_transpose_are_found():
    report = check_multi_head(SplitWithoutTranspose)
    assert report.codes == ["mixes-queries"], report.text()
    assert report.oracle["compared"] is True


def test_the_reason_names_heads_split_without_the_transpose():
    # A distance bias on top: no reading explains the outputs, so nothing is compared.
    report = check_multi_head(lambda E, H: SplitWithoutTranspose(E, H, slope=0.5))
    assert report.findings == [] and report.oracle["compared"] is False, report.text()
    why = report.oracle["why"]
    assert "rotary" in why and "view(B, H, T, d) without the transpose" in why, why
    zh = report.text(lang="zh")
    assert "view(B, H, T, d)" in zh and "transpose" in zh, zh
