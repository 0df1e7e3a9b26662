"""Correct functions in every convention get no error (DESIGN: a convention is named, never
called a bug), and their buggy twins get their codes with reproducers that fail on their
assert: a key-padding mask (B, Tk), inputs laid out (B, T, H, D) as JAX and flash-attn take
them, a function causal by itself without --causal. The look-alikes are in
tests/check/impl_calls/layouts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_attention, load_target  # noqa: E402
from attnkit.check.core.report import Finding, Report  # noqa: E402
from attnkit.cli import main  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402
from .test_calls import assert_errors_reproduce  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = "tests/check/impl_calls/layouts.py"
JUDGED_CAUSAL = "behaves as causal (judged as causal; pass --causal to declare it)"
HEADS_ON_AXIS_2 = ("(B, T, H, D) in and out, heads on axis 2 as JAX and flash-attn take them "
                   "(transposed to judge it)")


pytestmark = pytest.mark.usefixtures("at_root")


def fn(name):
    return load_target(f"{LAYOUTS}:{name}")


def assert_fails_on_its_assert(report, code):
    finding = next(f for f in report.findings if f.code == code)
    assert isinstance(raises_as_printed(finding.reproducer), AssertionError), finding.reproducer
    return finding


# -- a key padding mask, one flag per key -----------------------------------------------------
def test_a_key_padding_mask_is_fed_per_key():
    report = check_attention(fn("attention_key_padding"))
    assert report.findings == [], report.table()
    assert report.convention == ("masked (from the signature), key_padding_mask (B, Tk): one "
                                 "flag per key")
    assert "masked: float32" in " ".join(report.cases) and "mask random per key" in \
        " ".join(report.cases)
    assert "fully masked row: float32, q (2, 3, 4, 8), k (2, 3, 5, 8), v (2, 3, 5, 8), " \
           "mask empty per key" in report.cases


def test_a_key_padding_mask_ignored_or_inverted_is_found():
    ignored = check_attention(fn("attention_key_padding_ignored"))
    assert ignored.codes == ["inaccurate"], ignored.table()
    finding = assert_fails_on_its_assert(ignored, "inaccurate")
    assert "keep_keys = g.random(" in finding.reproducer  # the (B, Tk) mask, as it was fed
    inverted = check_attention(fn("attention_key_padding_inverted"))
    assert inverted.codes == ["mask-polarity"], inverted.table()
    assert_errors_reproduce(inverted)


def test_a_per_key_mask_named_mask_is_found_by_trying():
    """A mask (B, Tk) written for (B, T, D) inputs: neither its name nor its polarity says
    so; the check tries the layouts, then reads the polarity off behaviour."""
    report = check_attention(fn("attention_token_mask"))
    assert report.findings == [], report.table()
    assert report.convention == "keep (from behaviour), mask (B, Tk): one flag per key"
    assert report.layout == "(B, T, D)"
    assert report.seconds < 30


@pytest.mark.parametrize("name, convention", [
    ("attention_padding_required", "masked (from the signature), key_padding_mask (B, Tk): one "
                                   "flag per key"),
    ("attention_token_mask_required", "keep (from behaviour), mask (B, Tk): one flag per key"),
])
def test_a_required_per_key_mask(name, convention):
    report = check_attention(fn(name))
    assert report.findings == [], report.table()
    assert report.convention == convention


# -- (B, T, H, D) inputs ----------------------------------------------------------------------
def test_jax_layout_is_a_layout_not_a_shape_bug():
    report = check_attention(fn("dot_product_attention"))
    assert report.findings == [], report.table()
    assert report.layout == HEADS_ON_AXIS_2
    assert report.convention.startswith("keep (from behaviour), passed as mask=")
    unscaled = check_attention(fn("dot_product_attention_unscaled"))
    assert unscaled.codes == ["wrong-scale"], unscaled.table()
    assert unscaled.layout == HEADS_ON_AXIS_2
    finding = assert_fails_on_its_assert(unscaled, "wrong-scale")
    assert "fn(np.swapaxes(Q, 1, 2), np.swapaxes(K, 1, 2), np.swapaxes(V, 1, 2))" in \
        finding.reproducer


def test_flash_attn_layout_with_gradients_and_causal():
    report = check_attention(fn("flash_like"))
    assert report.findings == [] and report.framework == "torch", report.table()
    assert report.layout == HEADS_ON_AXIS_2 and report.causality == ""

    def causal(q, k, v):
        return fn("flash_like")(q, k, v, causal=True)

    assert check_attention(causal, causal=True).findings == []
    found = check_attention(causal)
    assert found.findings == [] and found.causality == JUDGED_CAUSAL, found.table()
    assert found.layout == HEADS_ON_AXIS_2


def test_a_head_first_function_keeps_its_layout_whatever_its_bug():
    """Behaviour, not the numbers, tells (B, H, T, D) from (B, T, H, D): a wrong scale in
    a (B, H, T, D) function is not read as another layout."""
    report = check_attention(fn("causal_bottom_right_unscaled"))
    assert report.layout == "(B, H, T, D)" and report.codes == ["wrong-scale"], report.table()


# -- causal by itself, not declared ------------------------------------------------------------
def test_a_causal_function_not_declared_is_judged_as_causal():
    report = check_attention(fn("causal_bottom_right"))
    assert report.findings == [], report.table()
    assert report.causality == JUDGED_CAUSAL
    unscaled = check_attention(fn("causal_bottom_right_unscaled"))
    assert unscaled.codes == ["wrong-scale"] and unscaled.causality == JUDGED_CAUSAL
    finding = assert_fails_on_its_assert(unscaled, "wrong-scale")
    assert "causal=True" in finding.reproducer  # the oracle it was judged against


def test_causal_for_self_attention_only_is_no_leak_unless_declared():
    """Causal when Tq == Tk, every key when Tq != Tk (a function shared by self- and
    cross-attention): undeclared, each case is judged by what it does, and the report
    says where it attends every key; declared causal, that is a leak."""
    report = check_attention(fn("causal_when_square"))
    assert report.findings == [], report.table()
    assert report.causality.startswith(JUDGED_CAUSAL + "; attends every key (judged so) on: "
                                       "Tq < Tk, Dk != Dv, Tq > Tk, Dk != Dv")
    declared = check_attention(fn("causal_when_square"), causal=True)
    assert declared.codes == ["causal-leak"], declared.table()
    assert_errors_reproduce(declared)


@pytest.mark.parametrize("name", ["sdpa_always_causal", "causal_top_left"])
def test_a_top_left_causal_function_is_a_warning(name):
    report = check_attention(fn(name))
    assert report.ok and report.codes == ["causal-alignment"], report.table()
    assert report.causality == JUDGED_CAUSAL
    assert_fails_on_its_assert(report, "causal-alignment")
    # causal alignment was tested: the no-mask note does not say otherwise
    assert "masks and empty rows were not tested" in report.table()
    assert "causal alignment were not tested" not in report.table()


def test_a_bidirectional_function_says_nothing_of_causality():
    report = check_attention(fn("dot_product_attention"))
    assert report.causality == ""


def test_the_command_names_the_causality(capsys):
    assert main(["check", "attention", f"{LAYOUTS}:causal_bottom_right"]) == 0
    assert JUDGED_CAUSAL in capsys.readouterr().out
    assert main(["check", "attention", f"{LAYOUTS}:sdpa_always_causal", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in data["findings"]] == ["causal-alignment"]


# -- the reproducer test itself ---------------------------------------------------------------
@pytest.mark.english_report  # reproducers written by hand, in English
def test_a_reproducer_that_crashes_does_not_count_as_failing():
    report = Report("attention", "fn")
    report.add(Finding("inaccurate", "made up", reproducer="import numpy as np\n"
                       "np.zeros(2) @ np.zeros(3)  # raises ValueError: not the bug's assert"))
    with pytest.raises(AssertionError, match="crashed"):
        assert_errors_reproduce(report)
    fine = Report("attention", "fn")
    fine.add(Finding("inaccurate", "made up", reproducer="assert 1 == 2, 'the bug'"))
    assert_errors_reproduce(fine)
