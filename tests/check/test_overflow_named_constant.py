"""``float16-overflow`` names the constant a learner's code fills with also when it is kept
under a name at the top of the file (``NEG_INF = -1e9``, a common idiom), not only when it
is written in the line: before, such code was told the overflow came from exp or a sum of
squares and to keep the softmax's statistics in float32, a fix that does not fix it."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_attention, check_model, load_target  # noqa: E402
from attnkit.check.catalogue import render  # noqa: E402

SOURCE = textwrap.dedent('''
    import math

    NEG_INF = -1e9  # the fill, kept as a name


    def attention(q, k, v, mask=None):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, NEG_INF)
        return s.softmax(-1) @ v


    def sdpa_like(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
        s = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
        s = s.masked_fill(~attn_mask, NEG_INF)
        return s.softmax(-1) @ value
''')
LINE = "s = s.masked_fill(~mask, NEG_INF)"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "named_fill.py"
    path.write_text(SOURCE)
    return path


def test_the_function_check_names_a_constant_kept_under_a_name(source):
    report = check_attention(load_target(f"{source}:attention"), convention="keep")
    (f,) = [f for f in report.findings if f.code == "float16-overflow"]
    assert "NEG_INF = -1000000000.0" in f.message and LINE in f.message, f.message
    assert "exp" not in f.message, f.message
    assert "NEG_INF = -1000000000.0" in render(f.message, "zh")
    (row,) = [f for f in report.findings if f.code == "fully-masked-row"]
    assert "NEG_INF = -1000000000.0 here" in row.message, row.message


def test_the_model_check_names_a_constant_kept_under_a_name(source):
    class Causal(torch.nn.Module):
        def forward(self, x):
            keep = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool).tril()
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=keep)

    x = torch.randn(1, 2, 5, 8).half()
    report = check_model(Causal().half(), (x,), implementation=load_target(f"{source}:sdpa_like"))
    (f,) = report.implementations[0].findings
    assert f.code == "float16-overflow", report.text()
    assert "NEG_INF = -1000000000.0" in f.message and "~attn_mask, NEG_INF" in f.message, \
        f.message
