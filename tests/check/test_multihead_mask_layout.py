"""A multi-head module's mask layout is found by trying each one, and a layout is taken only
when the module answers it with the right output: the ``(B, 1, Tq, Tk)`` try must be a mask
of B examples, not ``(1, 1, Tq, Tk)``. A module that takes a ``(B, Tk)`` padding mask named
plainly ``mask`` and reads it as ``mask.unsqueeze(1).unsqueeze(2)`` broadcasts a
``(1, 1, Tq, Tk)`` mask to scores ``(1, 1, B, H, Tq, Tk)`` of the right size, so that try was
taken, the mask went in garbled and the correct module was called ``inaccurate``."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from attnkit.check import check_multi_head  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402

pytestmark = pytest.mark.usefixtures("at_root")  # the reproducers load this file by name


class PaddingMaskAttention(nn.Module):
    """Correct self-attention; ``mask`` (B, T) bool, True = a real token (may be attended)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(1).unsqueeze(2) == 0, float("-inf"))
        y = s.softmax(-1) @ v  # (B, H, T, d)
        return self.out(y.transpose(1, 2).reshape(B, T, E))


def test_a_padding_mask_read_with_unsqueeze_is_fed_per_key():
    report = check_multi_head(PaddingMaskAttention)
    assert "inaccurate" not in report.codes, report.text()
    assert "(B, Tk)" in report.convention, report.convention
    assert "keep (from behaviour)" in report.convention, report.convention


class ZeroFilledMask(nn.Module):
    """Wrong: a (B, Tq, Tk) bool mask (True = may attend) whose masked scores are set to 0,
    not -inf, so masked keys still get weight. It takes only bool masks (``~mask``)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(~mask[:, None], 0.0)  # the bug: 0 is a score, not a mask
        y = s.softmax(-1) @ v  # (B, H, T, d)
        return self.out(y.transpose(1, 2).reshape(B, T, E))


def test_a_misapplied_mask_is_found_not_called_a_layout_the_module_refuses():
    """The bool tries fit; only the additive (float) try raises, on ``~mask``. No reading
    explains the outputs, since the mask is misapplied: that is the finding, not a
    call-failed that says the module took none of the layouts (which named only the float
    tries' TypeError)."""
    report = check_multi_head(ZeroFilledMask)
    assert "call-failed" not in report.codes, report.text()
    assert "inaccurate" in report.codes, report.text()
    assert "(B, Tq, Tk)" in report.convention, report.convention
    (found,) = [f for f in report.findings if f.code == "inaccurate"]
    assert isinstance(raises_as_printed(found.reproducer), AssertionError), found.reproducer
