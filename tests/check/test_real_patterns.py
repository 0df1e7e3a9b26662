"""What real code showed the checker got wrong (issue 37, part 3): each pattern is a
look-alike in tests/check/impl_calls/real_patterns.py. A correct one gets no error finding;
a buggy one its code, with a reproducer that fails as printed."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import (  # noqa: E402
    check_attention,
    check_masked_softmax,
    check_multi_head,
    check_softmax,
    load_target,
)
from attnkit.check.catalogue import render  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
IMPL = "tests/check/impl_calls/real_patterns.py"


pytestmark = pytest.mark.usefixtures("at_root")


def target(name):
    return load_target(f"{IMPL}:{name}")


def assert_reproduces(report, code):
    finding = next(f for f in report.findings if f.code == code)
    assert finding.reproducer, report.table()
    raised = raises_as_printed(finding.reproducer)
    assert raised is not None, f"the reproducer ran clean:\n{finding.reproducer}"
    assert not isinstance(raised, (NameError, SyntaxError, ImportError)), (
        f"{type(raised).__name__}: {raised}\n{finding.reproducer}")


# -- 1 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SelfOrCross", "SelfOrCrossNoMask"])
def test_self_or_cross_module_is_called_as_cross_attention(name):
    report = check_multi_head(target(name))
    assert report.ok and not report.findings, report.table()
    assert "self-attention m(x)" not in report.layout, report.layout
    assert any("Tq < Tk" in c for c in report.cases), report.cases


def test_self_or_cross_module_broken_for_cross_attention_is_found():
    report = check_multi_head(target("SelfOrCrossQueryLength"))
    assert "shape" in report.codes, report.table()
    assert_reproduces(report, "shape")


# -- 2 ----------------------------------------------------------------------------------------
def test_softmax_with_required_dim_is_checked():
    report = check_softmax(target("softmax_dim_required"))
    assert report.ok and not report.findings, report.table()
    assert "dim=-1" in report.convention, report.convention


def test_softmax_with_required_dim_gets_its_real_finding():
    report = check_softmax(target("softmax_dim_required_naive"))
    assert report.codes == ["nan-or-inf"], report.table()
    assert_reproduces(report, "nan-or-inf")


# -- 3 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("check, name", [(check_softmax, "softmax_global_max"),
                                         (check_attention, "attention_global_max")])
def test_softmax_with_the_global_max_is_found(check, name):
    report = check(target(name))
    assert "nan-or-inf" in report.codes, report.table()
    finding = next(f for f in report.findings if f.code == "nan-or-inf")
    assert "row" in finding.message and "max" in finding.message, finding.message
    assert_reproduces(report, "nan-or-inf")


# -- 4 ----------------------------------------------------------------------------------------
def test_function_raising_on_its_default_mask_is_checked_with_a_mask():
    report = check_attention(target("attention_unguarded_mask"))
    assert report.ok, report.table()
    assert not [f for f in report.findings if f.code == "call-failed"], report.table()
    assert "mask=None" in report.convention, report.convention


def test_function_raising_on_its_default_mask_gets_its_real_finding():
    report = check_attention(target("attention_unguarded_mask_unscaled"))
    assert report.codes == ["wrong-scale"], report.table()
    assert_reproduces(report, "wrong-scale")


# -- 5 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("check, name", [(check_softmax, "softmax_2d"),
                                         (check_attention, "attention_2d")])
def test_unbatched_functions_are_checked_in_2d(check, name):
    report = check(target(name))
    # a layout, named (a warning whose reproducer shows the batched call failing)
    assert report.ok and report.codes == ["one-sequence"], report.table()
    assert "one sequence" in report.layout, report.layout
    assert_reproduces(report, "one-sequence")


def test_unbatched_attention_gets_its_real_finding():
    report = check_attention(target("attention_2d_unscaled"))
    assert report.codes == ["wrong-scale", "one-sequence"], report.table()
    assert_reproduces(report, "wrong-scale")


# -- 6 ----------------------------------------------------------------------------------------
def test_mask_by_multiplication_fails_on_large_negative_logits():
    report = check_masked_softmax(target("masked_softmax_multiply"), convention="keep")
    assert not report.ok, report.table()
    assert any("-1e+03" in f.case or "-1e3" in f.case or "-1000" in f.case
               for f in report.findings), report.table()
    assert_reproduces(report, report.findings[0].code)


# -- 7 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("check, name", [(check_attention, "attention_mask_switch"),
                                         (check_multi_head, "SwitchCausal")])
def test_a_mask_that_only_switches_gets_no_polarity_finding(check, name):
    report = check(target(name))
    assert "mask-polarity" not in report.codes, report.table()


@pytest.mark.parametrize("check, name", [(check_attention, "attention_true_is_masked"),
                                         (check_multi_head, "AttnMaskTrueIsMasked")])
def test_attn_mask_true_is_masked_is_no_polarity_bug(check, name):
    report = check(target(name))
    assert "mask-polarity" not in report.codes, report.table()
    assert report.ok and not report.findings, report.table()
    assert report.convention.startswith("masked"), report.convention


# -- 8 ----------------------------------------------------------------------------------------
def test_masks_paired_with_the_wrong_examples_are_found():
    report = check_multi_head(target("PaddingRepeatMixed"))
    assert "inaccurate" in report.codes, report.table()
    assert "wrong examples" in report.findings[0].message, report.table()
    assert_reproduces(report, report.findings[0].code)


def test_masks_paired_with_their_examples_pass():
    report = check_multi_head(target("PaddingRepeatRight"))
    assert report.ok and not report.findings, report.table()


# -- 9 ----------------------------------------------------------------------------------------
def test_call_failed_has_a_reproducer_that_fails():
    report = check_attention(target("attention_cuda_only"))
    assert report.codes == ["call-failed"], report.table()
    assert_reproduces(report, "call-failed")


def test_module_call_failed_has_a_reproducer_and_the_line_that_raised():
    report = check_multi_head(target("CudaOnly"))
    assert report.codes == ["call-failed"], report.table()
    assert 'raise RuntimeError("this kernel runs on CUDA' in report.findings[0].message, \
        report.table()
    assert_reproduces(report, "call-failed")


def test_probe_shape_finding_has_a_reproducer_that_fails():
    report = check_softmax(target("softmax_no_keepdims"))
    assert report.findings and all(f.reproducer for f in report.findings if f.is_error), \
        report.table()
    for f in report.findings:
        assert_reproduces(report, f.code)


# -- 10 ---------------------------------------------------------------------------------------
def test_float16_overflow_names_a_constant_fill():
    report = check_attention(target("attention_fill_constant"), convention="keep")
    finding = next(f for f in report.findings if f.code == "float16-overflow")
    assert "-1e30" in finding.message and "-1e9" not in finding.message, finding.message


def test_float16_overflow_names_a_dtype_helper():
    report = check_attention(target("attention_dtype_helper"), convention="keep")
    finding = next(f for f in report.findings if f.code == "float16-overflow")
    assert "bfloat16" in finding.message and "-1e9" not in finding.message, finding.message


def test_float16_overflow_names_a_float32_attribute():
    report = check_multi_head(target("Float32Buffer"))
    finding = next(f for f in report.findings if f.code == "float16-overflow")
    assert "temperature" in finding.message and "-1e9" not in finding.message, \
        finding.message


def test_float16_failure_names_a_float32_tensor_made_in_forward():
    """A dtype-mismatch error was blamed on overflow ("a value overflows float16's range")
    or on a dtype helper the code does not have."""
    report = check_multi_head(target("Float32Table"))
    finding = next(f for f in report.findings if f.code == "float16-overflow")
    assert "made in forward stays float32" in finding.message, finding.message
    assert "overflows" not in finding.message and "helper" not in finding.message, \
        finding.message
    zh = report.text(lang="zh", reproducers=False)
    assert "forward 里新建的某个张量仍是 float32" in zh, zh


# -- 11 ---------------------------------------------------------------------------------------
def test_config_class_gets_its_factory_written_out():
    report = check_multi_head(target("FromConfig"))
    finding = next(f for f in report.findings if f.code == "call-failed")
    assert "def make(E, H): return FromConfig(config=TinyConfig(" in finding.message, \
        finding.message
    assert "rope_style=..." in finding.message, finding.message


def test_config_class_whose_constructor_raises_names_the_line_that_failed():
    report = check_multi_head(target("FromBadConfig"))
    finding = next(f for f in report.findings if f.code == "call-failed")
    assert "raise ValueError(f\"unknown rope_style" in finding.message, finding.message
    assert "def make(E, H): return FromBadConfig(config=BadConfig(" in finding.message, \
        finding.message
    assert_reproduces(report, "call-failed")


def test_seq_first_module_asserting_its_mask_layout_is_checked_seq_first():
    report = check_multi_head(target("SeqFirstAsserting"))
    assert report.ok and not report.findings, report.table()
    assert report.layout.startswith("(T, B, E)"), report.layout


def test_module_asserting_a_mask_it_cannot_get_names_the_line_and_the_factory():
    report = check_multi_head(target("AssertsFloatPadding"))
    finding = next(f for f in report.findings if f.code == "call-failed")
    assert "assert key_padding_mask.is_floating_point()" in finding.message, finding.message
    assert "class Checked(torch.nn.Module)" in finding.message, finding.message
    # the factory's code as written, its comment a sentence in the report's language
    zh = render(finding.message, "zh")
    assert "class Checked(torch.nn.Module)" in zh and "构造它所断言的那种掩码" in zh, zh
    assert "make the mask it asserts" in finding.message and "make the mask" not in zh
    assert_reproduces(report, "call-failed")


# -- 12 ---------------------------------------------------------------------------------------
def test_call_failed_leads_with_the_exception_that_stopped_the_call():
    report = check_attention(target("attention_cuda_only"))
    finding = report.findings[0]
    assert finding.code == "call-failed", report.table()
    first = finding.message.split(";")[0]
    assert "CUDA tensors only" in first, finding.message
