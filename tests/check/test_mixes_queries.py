"""``mixes-queries``: a multi-head module called ``m(query, key, value)`` whose heads are
split or merged without the transpose mixes tokens; the check names that bug once (not as
a fully masked row or a mask bug), with a reproducer that fails as printed, and never on a
correct module."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_multi_head, load_target  # noqa: E402
from attnkit.check.catalogue import code_words  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402

MIXING = "tests/check/impl_calls/heads_mixing.py"


pytestmark = pytest.mark.usefixtures("at_root")


@pytest.mark.parametrize("name, convention", [
    ("SplitWithoutTranspose", "auto"), ("SplitWithoutTranspose", "keep"),
    ("MergeWithoutTranspose", "auto"), ("MergeWithoutTranspose", "keep"),
    ("MergeWithoutTransposeByName", "auto"), ("NumpyMergeWithoutTranspose", "auto"),
])
def test_heads_that_mix_tokens_get_mixes_queries_only(name, convention):
    report = check_multi_head(load_target(f"{MIXING}:{name}"), convention=convention)
    # One bug, one finding: no fully-masked-row blaming a fill, no mask finding.
    assert report.codes == ["mixes-queries"], report.table()
    finding = report.findings[0]
    assert "transpose(1, 2)" in finding.message and "view(B, H, T, Dk)" in finding.message
    assert isinstance(raises_as_printed(finding.reproducer), AssertionError), \
        finding.reproducer


@pytest.mark.parametrize("name", ["Heads", "NumpyHeads"])
def test_correct_heads_get_no_finding(name):
    report = check_multi_head(load_target(f"{MIXING}:{name}"))
    assert report.findings == [], report.table()
    assert any("queries independent" in case for case in report.cases), report.cases


def test_self_attention_is_not_probed_for_mixing():
    report = check_multi_head(load_target(f"{MIXING}:PositionsInsideSelfAttention"))
    assert "mixes-queries" not in report.codes, report.table()
    assert not any("queries independent" in case for case in report.cases), report.cases


def test_mixes_queries_is_an_error_with_a_chinese_title():
    report = check_multi_head(load_target(f"{MIXING}:MergeWithoutTranspose"))
    assert not report.ok and report.findings[0].severity == "error"
    zh = code_words("mixes-queries", "zh")
    title, diagnosis = zh["title"], zh["what"] + zh["fix"]
    assert "查询" in title and "transpose" in diagnosis
    assert title in report.text(lang="zh")


def test_mixed_lengths_are_named_instead_of_the_heads_split():
    """Queries mixed by scores (B, Tk, Tq): the module also raises on Tq != Tk, so the
    finding points at the lengths, not at a split or merge that is right."""
    report = check_multi_head(load_target(f"{MIXING}:ScoresKeysByQueries"))
    mixing = [f for f in report.findings if f.code == "mixes-queries"]
    assert mixing and "(B, Tq, Tk)" in mixing[0].message, report.table()
    assert "view(B, H, T, Dk)" not in mixing[0].message
    assert "(B, Tq, Tk)" in report.text(lang="zh")
    shape = [f for f in report.findings if f.code == "shape"]
    assert shape and "Tq = Tk" in shape[0].message, report.table()
