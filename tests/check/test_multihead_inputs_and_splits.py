"""``check_multi_head`` against the oracle on what the probes used to hide: the oracle is
called with a value input of its own (not the key again), so a module that projects v
from the key, k from the value, or swaps them is ``inaccurate`` with its cause (they all
passed as "every case agrees with the oracle"); and a self-attention ``m(x)`` whose heads
are split with ``view(B, H, T, d)`` is ``mixes-queries`` (it was "not compared": the
outputs depend on the positions). Each reproducer runs as printed and fails; correct
modules of the same shapes stay clean."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_multi_head, load_target  # noqa: E402

from .conftest import english_sentences  # noqa: E402
from .reproducers import raises_as_printed  # noqa: E402

FILE = "tests/check/impl_calls/inputs_and_splits.py"

pytestmark = pytest.mark.usefixtures("at_root")


def _check(name: str):
    return check_multi_head(load_target(f"{FILE}:{name}"))


@pytest.mark.parametrize("name, words", [
    ("value_from_key", "the values are projected from the key input (self.v_proj reads key)"),
    ("key_from_value", "the keys are projected from the value input (self.k_proj reads value)"),
    ("key_value_swapped", "key and value are swapped"),
    ("FusedKVOnKey", "the values are projected from the key input (self.to_kv reads key)"),
    ("torch_value_is_key", "torch.nn.MultiheadAttention (attn) gets the key input as its value"),
])
def test_a_projection_that_reads_the_other_input_is_inaccurate(name, words):
    report = _check(name)
    assert report.codes == ["inaccurate"], report.text()
    assert words in report.findings[0].message, report.findings[0].message
    assert report.oracle["compared"] is True
    assert "every case agrees with the oracle" not in report.text()
    assert isinstance(raises_as_printed(report.findings[0].reproducer), AssertionError), \
        report.findings[0].reproducer
    zh = report.text(lang="zh", reproducers=False)
    detail = [line for line in zh.splitlines() if line.strip().startswith("详情")]
    assert detail and not english_sentences(detail[0]), detail


@pytest.mark.parametrize("name, structure", [
    ("split_and_merge_no_transpose", "separate q/k/v nn.Linear, 4 heads of 4"),
    ("SplitNoTranspose", "separate q/k/v nn.Linear, 4 heads of 4"),
    ("fused_split_no_transpose", "fused qkv nn.Linear, chunks in qkv order"),
    ("causal_split_no_transpose", ", causal"),
])
def test_self_attention_split_without_the_transpose_mixes_queries(name, structure):
    report = _check(name)
    assert report.codes == ["mixes-queries"], report.text()
    finding = report.findings[0]
    assert "view(B, H, T, Dk)" in finding.message and "transpose(1, 2)" in finding.message
    assert report.oracle["compared"] is True and structure in report.oracle["structure"]
    assert isinstance(raises_as_printed(finding.reproducer), AssertionError), \
        finding.reproducer
    assert "view(B, H, T, Dk)" in report.text(lang="zh")


def test_a_self_attention_merge_without_the_transpose_has_a_reproducer_that_fails():
    # Its reproducer changed one example of the batch and watched the other: it ran clean.
    report = _check("merge_no_transpose")
    assert report.codes == ["mixes-queries"], report.text()
    assert "merged without the transpose" in report.findings[0].message
    assert isinstance(raises_as_printed(report.findings[0].reproducer), AssertionError), \
        report.findings[0].reproducer


@pytest.mark.parametrize("name", ["CrossRoles", "OptionalKV", "TorchCross", "SelfRight",
                                  "self_causal", "self_dropout"])
def test_correct_modules_agree_with_the_oracle(name):
    report = _check(name)
    assert report.findings == [], report.text()
    assert report.oracle["compared"] is True, report.oracle


def test_a_learned_position_bias_is_not_compared_and_not_blamed():
    report = _check("self_position_bias")
    assert report.findings == [], report.text()
    assert report.oracle["compared"] is False and "(pos)" in report.oracle["why"]

