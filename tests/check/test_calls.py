"""The call read off the signature and the behaviour (issue: `attnkit check` on code as
people write it). Each look-alike in tests/check/impl_calls/ is a pattern people write:
each correct one gets no error finding, each buggy one exactly its codes, and the
reproducer of each error, run as printed, raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import (  # noqa: E402
    check_attention,
    check_masked_softmax,
    check_multi_head,
    load_target,
)
from attnkit.cli import main  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = "tests/check/impl_calls/functions.py"
MODULES = "tests/check/impl_calls/modules.py"


pytestmark = pytest.mark.usefixtures("at_root")


def fn(name):
    return load_target(f"{FUNCTIONS}:{name}")


def cls(name):
    return load_target(f"{MODULES}:{name}")


def assert_errors_reproduce(report):
    """Every error's reproducer, run as printed, fails on its own assert: not on a line of
    its own that crashes (a crash would fail as printed whatever the function does)."""
    for f in report.findings:
        if f.is_error and f.reproducer:
            assert "= ..." not in f.reproducer, f"a placeholder:\n{f.reproducer}"
            raised = raises_as_printed(f.reproducer)
            assert raised is not None, f"{f.code}: the reproducer ran clean:\n{f.reproducer}"
            assert isinstance(raised, AssertionError), (
                f"{f.code}: the reproducer crashed: {type(raised).__name__}: {raised}\n"
                f"{f.reproducer}")


# -- functions --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, flags", [
    ("attention_retain", "retain_derived"),
    ("attention_scale_flag", "scale"),
    ("attention_dropout_args", "dropout, training"),
])
def test_a_flag_after_q_k_v_is_not_fed_a_mask(name, flags):
    report = check_attention(fn(name))
    assert report.findings == [], report.table()
    assert report.convention.startswith("none") and flags in report.convention
    assert report.seconds < 30


def test_inputs_go_by_their_names():
    keyword_only = check_attention(fn("attention_keyword_only"))
    assert keyword_only.findings == [], keyword_only.table()
    assert keyword_only.convention.startswith("keep (from behaviour)")
    reordered = check_attention(fn("attention_value_first"))
    assert reordered.findings == [], reordered.table()


def test_a_layer_object_with_forward_and_no_call():
    report = check_attention(fn("layer"))
    assert report.findings == [] and report.framework == "numpy", report.table()
    assert "retain_derived left at default" in report.convention


@pytest.mark.parametrize("name, found", [
    ("masked_softmax_keep", "keep"),
    ("masked_softmax_masked", "masked"),
    ("torch_keep_softmax", "keep"),
])
def test_a_correct_masked_softmax_is_read_in_its_own_polarity(name, found):
    report = check_masked_softmax(fn(name))
    assert report.findings == [], report.table()
    assert report.convention == f"{found} (from behaviour)"


def test_an_inverted_masked_softmax_is_mask_polarity():
    report = check_masked_softmax(fn("masked_softmax_keep_inverted"), convention="keep")
    assert report.codes == ["mask-polarity"], report.table()
    assert_errors_reproduce(report)


def test_additive_mask_and_transposed_output_are_conventions():
    for convention in ("auto", "additive"):
        report = check_attention(fn("eager_like"), convention=convention)
        assert report.ok and set(report.codes) <= {"fully-masked-row"}, report.table()
        assert report.convention.startswith("additive")
        assert "scaling=1/sqrt(Dk)" in report.convention
        assert "output (B, Tq, H, Dv)" in report.layout
    # fully masked rows: a uniform row, as such a mask gives; named, a warning
    warning = report.findings[0]
    assert warning.severity == "warning" and "additive" in warning.message
    assert isinstance(raises_as_printed(warning.reproducer), AssertionError)


def test_an_additive_function_that_ignores_its_scaling_is_wrong_scale():
    report = check_attention(fn("eager_like_unscaled"))
    assert report.codes == ["wrong-scale"], report.table()
    assert_errors_reproduce(report)


def test_a_function_declared_causal():
    assert check_attention(fn("causal_attention"), causal=True).findings == []
    leak = check_attention(fn("causal_attention_mask_removed"), causal=True)
    assert leak.codes == ["causal-leak"], leak.table()
    assert "declared causal" in leak.causality
    assert_errors_reproduce(leak)
    # Undeclared, a causal function is a convention: found by behaviour, named, judged
    # as causal (tests/check/test_layouts.py has more).
    undeclared = check_attention(fn("causal_attention"))
    assert undeclared.findings == [], undeclared.table()
    assert undeclared.causality.startswith("behaves as causal (judged as causal")
    with pytest.raises(ValueError, match="sdpa"):
        check_attention(torch.nn.functional.scaled_dot_product_attention, convention="sdpa",
                        causal=True)


def test_a_parameter_the_check_cannot_fill_is_call_failed():
    report = check_attention(fn("needs_config"))
    assert report.codes == ["call-failed"], report.table()
    assert "config" in report.findings[0].message
    assert "missing 1 required positional argument" in report.findings[0].measured


def test_the_calling_layer_first_gets_a_stand_in():
    report = check_attention(fn("eager_like_with_module"))
    assert report.ok and set(report.codes) <= {"fully-masked-row"}, report.table()
    assert "module=a stand-in" in report.convention
    assert report.convention.startswith("additive (from behaviour), passed as attention_mask=")
    # its reproducers build the same stand-in and run
    assert "SimpleNamespace(training=False" in report.findings[0].reproducer
    assert isinstance(raises_as_printed(report.findings[0].reproducer), AssertionError)


# -- modules ----------------------------------------------------------------------------------
def test_self_attention_with_a_mask_is_called_with_mask_by_name():
    report = check_multi_head(cls("SelfAttentionWithMask"))
    assert report.findings == [], report.table()
    assert report.convention.startswith("keep (from behaviour), passed as mask=")
    assert "self-attention m(x)" in report.layout
    assert report.causality.startswith("bidirectional")
    assert report.seconds < 60
    inverted = check_multi_head(cls("SelfAttentionInvertedMask"), convention="keep")
    assert inverted.codes == ["mask-polarity"], inverted.table()
    assert_errors_reproduce(inverted)
    # The same module, read by behaviour: True = masked, and then it is right.
    auto = check_multi_head(cls("SelfAttentionInvertedMask"))
    assert auto.findings == [] and auto.convention.startswith("masked (from behaviour)")


def test_only_the_shape_cases_that_ran_are_listed():
    report = check_multi_head(cls("SelfAttentionReturnFlag"))
    assert report.findings == [], report.table()
    assert report.convention.startswith("none")
    shapes = [c for c in report.cases if c.startswith("shapes")]
    assert shapes == ["shapes: Tq == Tk"]
    cross = check_multi_head(cls("QKVByName"))
    assert "shapes: Tq == Tk, Tq < Tk, Tq > Tk" in cross.cases


def test_causality_is_stated_and_checked_when_declared():
    causal = check_multi_head(cls("CausalSelfAttention"))
    assert causal.findings == [] and causal.causality.startswith("behaves as causal")
    assert check_multi_head(cls("CausalSelfAttention"), causal=True).findings == []
    bidirectional = check_multi_head(cls("BidirectionalSelfAttention"))
    assert bidirectional.findings == [] and bidirectional.causality.startswith("bidirectional")
    removed = check_multi_head(cls("CausalMaskRemoved"))
    assert removed.findings == [] and removed.causality.startswith("bidirectional")
    leak = check_multi_head(cls("CausalMaskRemoved"), causal=True)
    assert leak.codes == ["causal-leak"], leak.table()
    assert_errors_reproduce(leak)


def test_a_causal_module_with_a_mask_is_read_in_its_own_polarity():
    """Keys flagged late would tell nothing here: a causal module's early rows never see
    them, whichever way it reads the mask."""
    report = check_multi_head(cls("CausalWithKeepMask"))
    assert report.findings == [], report.table()
    assert report.convention.startswith("keep (from behaviour)")
    assert report.causality.startswith("behaves as causal")
    # The mask probes watch rows that a causal module lets see the masked keys: a mask
    # argument it never applies shows.
    ignored = check_multi_head(cls("CausalMaskArgumentIgnored"), convention="keep")
    assert ignored.codes == ["inaccurate"], ignored.table()
    assert "masked keys change the output" in ignored.findings[0].message
    assert_errors_reproduce(ignored)


def test_sequence_first_module_is_found_by_trying():
    report = check_multi_head(cls("SequenceFirst"))
    assert report.findings == [], report.table()
    assert report.layout.startswith("(T, B, E)")
    assert report.convention.startswith("masked (from behaviour), passed as attn_mask=")


def test_key_padding_mask():
    report = check_multi_head(cls("KeyPaddingOnly"))
    assert report.findings == [], report.table()
    assert report.convention == "masked (from the signature), passed as key_padding_mask= (B, Tk)"
    ignored = check_multi_head(cls("KeyPaddingIgnored"))
    assert ignored.codes == ["inaccurate"], ignored.table()
    assert "masked keys change the output" in ignored.findings[0].message
    assert_errors_reproduce(ignored)


def test_a_per_token_mask_found_by_trying():
    report = check_multi_head(cls("TokenMask"))
    assert report.findings == [], report.table()
    assert report.convention == "keep (from behaviour), passed as mask= (B, Tk)"


def test_additive_mask_module():
    report = check_multi_head(cls("AdditiveSelfAttention"))
    assert report.ok and set(report.codes) <= {"fully-masked-row"}, report.table()
    assert report.convention.startswith("additive (from behaviour), passed as attention_mask=")
    declared = check_multi_head(cls("AdditiveSelfAttention"), convention="additive")
    assert declared.ok and set(declared.codes) <= {"fully-masked-row"}, declared.table()


def test_no_mask_layout_fits_is_call_failed_not_a_crash():
    report = check_multi_head(cls("HeadFirstMask"))
    assert report.codes == ["call-failed"], report.table()
    assert "(H, B, Tq, Tk)" in report.findings[0].measured  # the module's own words
    assert "masks not tested" in report.convention


def test_inputs_by_name_in_a_module():
    report = check_multi_head(cls("QKVByName"))
    assert report.findings == [], report.table()
    assert "inputs by name query=, key=, value=" in report.layout
    cross = check_multi_head(cls("KeywordOnlyCross"))
    assert cross.findings == [] and cross.convention.startswith("keep"), cross.table()
    own = check_multi_head(cls("KeywordOnlySelfAttention"))
    assert own.findings == [] and own.convention.startswith("keep"), own.table()
    assert "self-attention m(x)" in own.layout and "inputs by name x=" in own.layout


def test_the_command_takes_causal_and_additive(capsys):
    assert main(["check", "multi-head", f"{MODULES}:CausalMaskRemoved", "--causal",
                 "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in data["findings"]] == ["causal-leak"]
    assert main(["check", "attention", f"{FUNCTIONS}:eager_like", "--convention",
                 "additive"]) == 0
    assert "convention additive (declared)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["check", "softmax", f"{FUNCTIONS}:masked_softmax_keep", "--causal"])
    assert exit_.value.code == 2
