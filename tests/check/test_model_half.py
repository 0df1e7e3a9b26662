"""``float16-overflow`` in a model names the cause the code has: the constant and its line
where the implementation under test (or the module that made the call) writes one, the
setting that holds it, and otherwise what was measured and the kinds of cause, never a
``-1e9`` the code does not contain."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lookalikes as L  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import render  # noqa: E402


def exp_without_max(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """Planted: softmax as exp / sum without subtracting the row's max (no constant)."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    keep, _ = L._keep(query, key, attn_mask, is_causal)
    w = ((query @ key.transpose(-1, -2)) * scale).exp() * keep
    return (w / w.sum(-1, keepdim=True)) @ value


class LoudScores(nn.Module):
    """Causal attention on its input as q, k and v: scores near 16, which exp cannot hold
    in float16 (its largest value is 65504 = exp(11.1)). It keeps a float32 table as a
    plain attribute on purpose (as models keep rotary tables): not the cause."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.ones(6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def _loud() -> tuple:
    torch.manual_seed(0)
    return LoudScores().half(), ((2 * torch.randn(1, 2, 6, 16)).half(),)


def _only(report):
    (f,) = report.implementations[0].findings
    assert f.code == "float16-overflow", report.text()
    return f


def test_a_planted_fill_names_the_constant_and_its_line():
    torch.manual_seed(0)
    model = L.GPT().half()
    f = _only(check_model(model, (L.tokens(),),
                          implementation={"blocks.1.attn": L.fill_minus_1e9}))
    line = "s = s.masked_fill(~keep, -1e9)"
    assert "the constant -1e9" in f.message and line in f.message, f.message
    zh = render(f.message, "zh")
    assert "常数 -1e9" in zh and line in zh, zh


def test_a_fill_kept_as_a_setting_of_the_module_is_named():
    torch.manual_seed(0)
    model = L.MHAModel(planted=L.HandMHA(L.WIDTH, L.HEADS, fill=-1e9)).half()
    f = _only(check_model(model, (L.tokens(), ~L.padded())))
    assert "self.fill = -1000000000.0 does not fit in float16" in f.message, f.message


def test_exp_overflow_names_what_was_measured_and_no_constant():
    model, inputs = _loud()
    assert check_model(model, inputs).ok  # torch's own SDPA subtracts the max
    f = _only(check_model(model, inputs, implementation=exp_without_max))
    assert "1e9" not in f.message and "1e9" not in render(f.message, "zh"), f.message
    assert f.message.startswith("NaN/inf in float16 where the same call in float32 is "
                                "finite"), f.message
    assert "exp" in f.message and "overflows float16's range" in f.message, f.message
    assert "self.table" not in f.message, f.message


def test_code_that_cannot_be_read_is_said_so_without_a_constant():
    """A model and an implementation with no source file (made by exec): no code is read,
    so the sentence names the kinds of cause and says the code could not be read."""
    space: dict = {"math": math, "L": L, "nn": nn, "F": F}
    exec("def no_source(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,\n"
         "              scale=None, enable_gqa=False):\n"
         "    w = ((query @ key.transpose(-1, -2)) / math.sqrt(query.shape[-1])).exp()\n"
         "    w = w * L._keep(query, key, attn_mask, is_causal)[0]\n"
         "    return (w / w.sum(-1, keepdim=True)) @ value\n"
         "class Loud(nn.Module):\n"
         "    def forward(self, x):\n"
         "        return F.scaled_dot_product_attention(x, x, x, is_causal=True)\n", space)
    _, inputs = _loud()
    model = space["Loud"]().half()
    f = _only(check_model(model, inputs, implementation=space["no_source"]))
    assert "cannot read" in f.message and "1e9" not in f.message, f.message
    assert "无法读取" in render(f.message, "zh")


def test_a_transformers_kernel_with_a_fill_names_its_line():
    pytest.importorskip("transformers",
                        reason="check model needs `pip install attnkit[transformers]`")
    from model_faults import register_faults

    from attnkit.check.model.load import tiny_model

    register_faults()
    report = check_model(tiny_model("llama", "float16"),
                         implementations=["sdpa", "fault-fill-1e9"], padding="left")
    (f,) = report.findings("fault-fill-1e9")
    assert f.code == "float16-overflow"
    assert "scores = scores.masked_fill(~attention_mask, -1e9)" in f.message, f.message
