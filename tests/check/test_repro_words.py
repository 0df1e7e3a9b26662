"""The reproducers of the function and multi-head checks in the report's language: in Chinese
their comments, printed labels, assertion messages and docstrings are Chinese, while their
code is the same token for token, and run as printed they fail as the English ones do."""

from __future__ import annotations

import io
import json
import re
import tokenize

import pytest

pytest.importorskip("torch")

from attnkit.check import (  # noqa: E402
    check_attention,
    check_masked_softmax,
    check_multi_head,
    check_softmax,
    load_target,
)
from attnkit.check.catalogue import render  # noqa: E402

from .reproducers import raises_as_printed, reproducer_prose  # noqa: E402

pytestmark = pytest.mark.usefixtures("at_root")

CJK = re.compile(r"[\u4e00-\u9fff]")
CHECKS = {"softmax": check_softmax, "masked-softmax": check_masked_softmax,
          "attention": check_attention, "multi-head": check_multi_head}
CALLS = "tests/check/impl_calls"

# (check, target, convention, a code it finds): each code's reproducer is written by
# different lines (the oracle's and other readings', a gradient, an argument written into,
# a function taking one sequence (the wrapper's docstring), a call that fails on a shape; a
# module's mask, gradient, state_dict, half-precision and attention-core probes).
TARGETS = [
    ("attention", "examples/check/attention_bugs.py:attention_unscaled", "auto", "wrong-scale"),
    ("attention", "examples/check/attention_bugs.py:attention_custom_backward", "auto",
     "gradient"),
    ("masked-softmax", "examples/check/masked_softmax.py:masked_softmax_d2l", "auto",
     "mutates-input"),
    ("attention", f"{CALLS}/real_patterns.py:attention_2d_unscaled", "auto", "one-sequence"),
    ("softmax", f"{CALLS}/real_patterns.py:softmax_no_keepdims", "auto", "shape"),
    ("multi-head", "examples/check/modules.py:FillMinus1e9", "masked", "float16-overflow"),
    ("multi-head", "examples/check/modules.py:MultiHead", "keep", "mask-polarity"),
    ("multi-head", "examples/check/modules.py:UnusedGate", "auto", "no-gradient"),
    ("multi-head", "examples/check/modules.py:PlainTensorBias", "auto", "state-dict"),
    ("multi-head", f"{CALLS}/oracle_modules.py:no_scale", "auto", "wrong-scale"),
]


def code_of(text: str) -> list[tuple[int, str]]:
    """The tokens of a reproducer, comments left out and every string literal one token."""
    return [(t.type, "" if t.type == tokenize.STRING else t.string)
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type != tokenize.COMMENT]


@pytest.mark.parametrize("check, target, convention, code", TARGETS,
                         ids=[f"{t[1].split(':')[1]}-{t[3]}" for t in TARGETS])
def test_a_chinese_reproducer_is_the_same_code_and_fails_the_same(check, target, convention,
                                                                  code, english_in):
    report = CHECKS[check](load_target(target), convention=convention)
    assert code in report.codes, report.table()
    for f in report.findings:
        if not f.reproducer:
            continue
        en, zh = render(f.reproducer, "en"), render(f.reproducer, "zh")
        assert en == f.reproducer
        assert code_of(zh) == code_of(en), zh
        prose = reproducer_prose(zh)
        assert prose and not [s for p in prose for s in english_in(p)], zh
        assert any(CJK.search(p) for p in prose), zh
        raised_en, raised_zh = raises_as_printed(en), raises_as_printed(zh)
        assert raised_en is not None, (f.code, en)
        assert type(raised_zh) is type(raised_en), (f.code, raised_en, raised_zh, zh)
        if isinstance(raised_en, AssertionError) and str(raised_en):  # its message, in Chinese
            assert CJK.search(str(raised_zh)), (f.code, raised_zh)


def test_the_text_and_json_reports_write_the_reproducer_in_their_language():
    report = check_attention(load_target("examples/check/attention_bugs.py:attention_unscaled"))
    (f,) = [f for f in report.findings if f.code == "wrong-scale"]
    zh, en = report.text(lang="zh"), report.text(lang="en")
    assert "# float64 参考实现" in zh and "与参考实现的最大误差" in zh
    assert "# the float64 oracle" in en and "参考实现" not in en
    for line in code_of(render(f.reproducer, "zh")):
        assert line[1] in zh
    items = json.loads(report.to_json("zh"))["findings"]
    assert [i["reproducer"] for i in items if i["code"] == "wrong-scale"] == \
        [render(f.reproducer, "zh")]
