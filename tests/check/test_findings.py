"""Each hand-written bug of examples/check/ is flagged with its code and no other error
code, and the reproducer of each finding, run as printed, shows the bug; each fix is clean."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from attnkit.check import (  # noqa: E402
    check_attention,
    check_masked_softmax,
    check_multi_head,
    check_softmax,
    load_target,
)

from .reproducers import raises_as_printed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "check"
CHECKS = {"softmax": check_softmax, "masked-softmax": check_masked_softmax,
          "attention": check_attention, "multi-head": check_multi_head}

# (check, file:name, convention, the error code, the other codes it may also carry: warnings,
# and for the seed-003 helper as the notes copy it, its second bug)
BUGS = [
    ("softmax", "softmaxes.py:softmax_naive", "auto", "nan-or-inf", ()),
    ("attention", "attention_bugs.py:attention_naive_softmax", "auto", "nan-or-inf", ()),
    ("attention", "attention_bugs.py:attention_fill_1e9", "masked", "float16-overflow",
     ("fully-masked-row",)),
    ("attention", "attention_bugs.py:attention_scale_in_place", "auto", "mutates-input", ()),
    ("attention", "attention_bugs.py:attention_unscaled", "auto", "wrong-scale", ()),
    ("attention", "attention_bugs.py:attention_mask_true_is_masked", "keep", "mask-polarity", ()),
    ("attention", "attention_bugs.py:attention_reshaped_like_q", "auto", "shape", ()),
    ("attention", "attention_bugs.py:attention_custom_backward", "auto", "gradient", ()),
    ("attention", "attention_bugs.py:attention_half_scores", "auto", "inaccurate", ()),
    ("masked-softmax", "masked_softmax.py:masked_softmax_d2l", "auto", "mutates-input",
     ("fully-masked-row", "float16-overflow")),
    ("masked-softmax", "masked_softmax.py:masked_softmax_in_place", "auto", "mutates-input", ()),
    ("masked-softmax", "masked_softmax.py:masked_softmax_fill_1e6", "auto", "float16-overflow",
     ("fully-masked-row",)),
    ("multi-head", "modules.py:PlainListProjections", "auto", "unregistered-parameter", ()),
    ("multi-head", "modules.py:FillMinus1e9", "masked", "float16-overflow",
     ("fully-masked-row",)),
    ("multi-head", "modules.py:FunctionalDropout", "auto", "dropout-in-eval", ()),
    ("multi-head", "modules.py:UnusedGate", "auto", "no-gradient", ()),
    ("multi-head", "modules.py:PlainTensorBias", "auto", "state-dict", ()),
    ("multi-head", "modules.py:MultiHead", "keep", "mask-polarity", ()),
    ("multi-head", "numpy_mha.py:NaiveSoftmax", "auto", "nan-or-inf", ()),
]


pytestmark = pytest.mark.usefixtures("at_root")


@pytest.mark.parametrize("check, target, convention, code, also", BUGS,
                         ids=[f"{b[1].split(':')[1]}-{b[3]}" for b in BUGS])
def test_bug_is_flagged_with_its_code_only(check, target, convention, code, also):
    report = CHECKS[check](load_target(f"examples/check/{target}"), convention=convention)
    assert code in report.codes and set(report.codes) <= {code, *also}, report.table()
    assert not report.ok
    finding = next(f for f in report.findings if f.code == code)
    assert finding.message and finding.severity == "error"
    # The reproducer shows the bug: run as printed, it raises (a failed assert, or the
    # function's own error).
    assert finding.reproducer, finding
    raised = raises_as_printed(finding.reproducer)
    assert raised is not None, f"the reproducer ran clean:\n{finding.reproducer}"
    assert not isinstance(raised, (NameError, SyntaxError, ImportError)), (
        f"{type(raised).__name__}: {raised}\n{finding.reproducer}")


def test_warnings_have_reproducers_that_show_them():
    report = check_attention(load_target("examples/check/attention_bugs.py:attention_fill_1e9"),
                             convention="masked")
    warning = next(f for f in report.findings if f.code == "fully-masked-row")
    assert warning.severity == "warning"
    assert isinstance(raises_as_printed(warning.reproducer), AssertionError)


def test_top_left_causal_is_a_warning_not_an_error():
    report = check_attention(load_target("examples/check/attention_bugs.py:attention_top_left"))
    assert report.convention.startswith("sdpa")
    assert report.codes == ["causal-alignment"] and report.ok, report.table()
    assert isinstance(raises_as_printed(report.findings[0].reproducer), AssertionError)


FIXED = [
    ("softmax", "softmaxes.py:softmax", "auto", "none"),
    ("softmax", "softmaxes.py:softmax_torch", "auto", "none"),
    ("attention", "attention_fixed.py:attention", "auto", "none"),
    ("attention", "attention_fixed.py:attention_masked", "auto", "masked"),
    ("attention", "attention_fixed.py:attention_masked", "masked", "masked"),
    ("attention", "attention_fixed.py:attention_keep", "auto", "keep"),
    ("attention", "attention_fixed.py:attention_valid_lens", "auto", "valid_lens"),
    ("attention", "attention_fixed.py:attention_sdpa", "auto", "sdpa"),
    ("attention", "attention_fixed.py:attention_d2l", "auto", "valid_lens"),
    ("masked-softmax", "masked_softmax.py:masked_softmax", "auto", "valid_lens"),
    ("multi-head", "modules.py:MultiHead", "auto", "masked"),
    ("multi-head", "numpy_mha.py:MultiHead", "auto", "keep"),
]


@pytest.mark.parametrize("check, target, convention, used", FIXED,
                         ids=[f"{f[1].split(':')[1]}-{f[2]}" for f in FIXED])
def test_correct_implementations_get_no_finding(check, target, convention, used):
    report = CHECKS[check](load_target(f"examples/check/{target}"), convention=convention)
    assert report.findings == [] and report.ok, report.table()
    assert report.convention.split()[0] == used
    assert len(report.cases) >= 4  # the cases ran (a NumPy class has 4, a module 9)


# (bug, its fix, the check): the bug's reproducer, pointed at the fix, runs clean.
FIXES = [
    ("softmax", "softmaxes.py:softmax_naive", "softmaxes.py:softmax"),
    ("attention", "attention_bugs.py:attention_naive_softmax", "attention_fixed.py:attention"),
    ("attention", "attention_bugs.py:attention_unscaled", "attention_fixed.py:attention"),
    ("attention", "attention_bugs.py:attention_half_scores", "attention_fixed.py:attention"),
    ("masked-softmax", "masked_softmax.py:masked_softmax_d2l", "masked_softmax.py:masked_softmax"),
]


@pytest.mark.parametrize("check, bug, fix", FIXES, ids=[f[1].split(":")[1] for f in FIXES])
def test_a_reproducer_runs_clean_on_the_fix(check, bug, fix):
    report = CHECKS[check](load_target(f"examples/check/{bug}"))
    for finding in report.findings:
        assert f"examples/check/{bug}" in finding.reproducer
        fixed = finding.reproducer.replace(f"examples/check/{bug}", f"examples/check/{fix}")
        assert raises_as_printed(fixed) is None, fixed
