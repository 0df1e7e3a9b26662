"""A multi-head module whose ``forward(x, context=None)`` takes an optional second input
that is no mask (cross-attention's context, as many diffusion and perceiver blocks write
it) is checked as self-attention. The check takes an unnamed parameter right after the
input for the mask; one that takes no mask layout, and may be left out, is no mask: the
header says masks were not tested. Before, the correct module got a ``call-failed`` error
("context= took none of the mask layouts") with a reproducer that fed it a bool mask."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from attnkit.check import check_multi_head  # noqa: E402


class ContextAttention(nn.Module):
    """Correct: self-attention on x, cross-attention on context when one is given; q from
    its own projection, k and v from one fused kv projection."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.to_q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.to_kv = nn.Linear(embed_dim, 2 * embed_dim, bias=False)
        self.to_out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        B, Tq, E = x.shape
        Tk = context.shape[1]
        q = self.to_q(x).view(B, Tq, self.h, self.d).transpose(1, 2)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        k = k.reshape(B, Tk, self.h, self.d).transpose(1, 2)
        v = v.reshape(B, Tk, self.h, self.d).transpose(1, 2)
        w = (q @ k.transpose(-1, -2) * self.d ** -0.5).softmax(-1)  # (B, H, Tq, Tk)
        return self.to_out((w @ v).transpose(1, 2).reshape(B, Tq, E))


def test_an_optional_input_that_takes_no_mask_is_no_mask():
    report = check_multi_head(ContextAttention)
    assert report.findings == [], report.text()
    assert report.oracle["compared"], report.oracle
    assert "context= took no known layout: masks not tested" in report.convention


def test_a_declared_mask_that_takes_no_layout_is_still_reported():
    """Declared by the user (--convention keep), the parameter is a mask: no layout fits."""
    report = check_multi_head(ContextAttention, convention="keep")
    assert report.codes == ["call-failed"], report.text()
