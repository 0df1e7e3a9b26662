"""Wrong multi-head modules as learners write them, each named for what it does wrong.

A ``key_padding_mask`` (B, Tk) broadcast onto the query axis, ``mask[:, None, :, None]``,
blanks the padded positions' own rows (``nan_to_num`` after an all ``-inf`` row) while every
query still attends the padded keys. The polarity probe watches exactly the blanked rows, so
the module was called ``mask-polarity`` ("it attends exactly the keys the mask excludes"),
which sends the learner to flip a mask that has the right polarity.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from attnkit.check import check_multi_head  # noqa: E402


class PaddingOnQueries(nn.Module):
    """Wrong: the padding mask (True = pad) masks queries, not keys."""

    def __init__(self, embed_dim: int, num_heads: int, on_keys: bool = False) -> None:
        super().__init__()
        self.h, self.d, self.on_keys = num_heads, embed_dim // num_heads, on_keys
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, None, :] if self.on_keys \
                else key_padding_mask[:, None, :, None]  # the bug: the query axis
            s = s.masked_fill(pad, float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        return self.proj((w @ v).transpose(1, 2).reshape(B, T, E))


def test_a_padding_mask_on_the_query_axis_is_not_called_mask_polarity():
    report = check_multi_head(PaddingOnQueries)
    assert report.codes == ["inaccurate"], report.text()
    assert "query axis" in report.findings[0].message, report.findings[0].message
    fixed = check_multi_head(lambda E, H: PaddingOnQueries(E, H, on_keys=True))
    assert fixed.findings == [], fixed.text()


class CausalDiagonal(nn.Module):
    """Wrong: the causal mask is ``triu(ones, diagonal=0)``, so no query sees its own key
    (query 0 sees none and is blanked). The fix masks ``triu(ones, diagonal=1)``."""

    def __init__(self, embed_dim: int, num_heads: int, diagonal: int = 0) -> None:
        super().__init__()
        self.h, self.d, self.diagonal = num_heads, embed_dim // num_heads, diagonal
        self.q, self.k, self.v = (nn.Linear(embed_dim, embed_dim) for _ in range(3))
        self.o = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, self.h, self.d).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        later = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=self.diagonal)
        w = torch.softmax(s.masked_fill(later, float("-inf")), dim=-1).nan_to_num(0.0)
        return self.o((w @ v).transpose(1, 2).reshape(B, T, E))


def test_a_causal_mask_that_hides_the_diagonal_is_found_not_left_uncompared():
    """It leaks nothing, so ``causal-leak`` cannot see it; the oracle did not fit and the
    module passed as "not compared". The reading with the diagonal masked names it."""
    report = check_multi_head(CausalDiagonal, causal=True)
    assert report.codes == ["inaccurate"], report.text()
    assert "diagonal" in report.findings[0].message, report.findings[0].message
    assert report.oracle["compared"], report.oracle
    fixed = check_multi_head(lambda E, H: CausalDiagonal(E, H, diagonal=1), causal=True)
    assert fixed.findings == [] and fixed.oracle["compared"], fixed.text()


class OverTheHeads(nn.Module):
    """Wrong: q, k, v viewed as ``(B, T, H, Dk)`` with no ``transpose(1, 2)``, so the scores
    are ``(B, T, H, H)`` and each token attends over its own heads. No token sees a later one,
    so it behaves causal; the core fit no causal reading and it passed as "not compared"."""

    def __init__(self, embed_dim: int, num_heads: int, transpose: bool = False) -> None:
        super().__init__()
        self.h, self.d, self.transpose = num_heads, embed_dim // num_heads, transpose
        self.q, self.k, self.v = (nn.Linear(embed_dim, embed_dim) for _ in range(3))
        self.o = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, self.h, self.d) for p in (self.q, self.k, self.v))
        if self.transpose:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        y = torch.softmax(s, dim=-1) @ v
        if self.transpose:
            y = y.transpose(1, 2)
        return self.o(y.reshape(B, T, E))


def test_attention_over_the_heads_instead_of_the_tokens_is_found():
    report = check_multi_head(OverTheHeads)
    assert report.codes == ["inaccurate"], report.text()
    assert "over the heads" in report.findings[0].message, report.findings[0].message
    fixed = check_multi_head(lambda E, H: OverTheHeads(E, H, transpose=True))
    assert fixed.findings == [] and fixed.oracle["compared"], fixed.text()


class ReluAfter(nn.Module):
    """Attention whose output goes through a relu: autograd's gradient is right, but a step
    of central differences that crosses the relu's kink is not."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
        self.q, self.k, self.v = (nn.Linear(embed_dim, embed_dim) for _ in range(3))
        self.o = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, self.h, self.d).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d), dim=-1) @ v
        return torch.relu(self.o(y.transpose(1, 2).reshape(B, T, E)))


def test_a_relu_is_not_called_a_wrong_hand_written_backward():
    report = check_multi_head(ReluAfter)
    assert "gradient" not in report.codes, report.text()


_NOTEBOOK_CLASS = '''
import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self, embed_dim, num_hiddens):
        super().__init__()
        if num_hiddens != embed_dim:
            raise ValueError("this layer keeps the width")
        self.W_q = nn.Linear(embed_dim, num_hiddens, bias=False)

    def forward(self, queries, keys, values, valid_lens=None):
        return values[:, :1] + 0 * self.W_q(queries).sum()  # one query out: a shape bug
'''


def test_a_notebook_class_is_rebuilt_in_its_reproducer_as_the_check_built_it():
    # A class defined in a notebook cannot be loaded from a file: its reproducer binds
    # `factory` to it and must call it with the arguments the check used (embed_dim=16,
    # num_hiddens=16), not factory(16, 4), which this constructor refuses.
    from .reproducers import raises_as_printed

    ns: dict = {"__name__": "__notebook__"}
    exec(compile(_NOTEBOOK_CLASS, "<cell>", "exec"), ns)
    report = check_multi_head(ns["Wide"])
    shape = next(f for f in report.findings if f.code == "shape")
    assert "factory(embed_dim=16, num_hiddens=16)" in str(shape.reproducer), shape.reproducer
    assert isinstance(raises_as_printed(str(shape.reproducer), Wide=ns["Wide"]), AssertionError)
