"""``check_multi_head`` against the float64 oracle, from the module's own weights: the wrong
modules a learner writes are found with the code that names the cause (they all passed as
"every case agrees with the oracle" before), correct modules of every structure the check
reads agree with it, and modules it cannot read (rotary, a norm on q/k) get no finding and
say that they were not compared."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import attnkit.torch as at  # noqa: E402
from attnkit.check import check_attention, check_multi_head, load_target  # noqa: E402

FILE = "tests/check/impl_calls/oracle_modules.py"


pytestmark = pytest.mark.usefixtures("at_root")


def _check(name: str):
    return check_multi_head(load_target(f"{FILE}:{name}"))


@pytest.mark.parametrize("name, code, words", [
    ("no_scale", "wrong-scale", "not scaled: the 1/sqrt(Dk) is missing"),
    ("width_scale", "wrong-scale", "1/sqrt(E) = 0.25, the model width"),
    ("ConstantScale", "wrong-scale", "0.125 at every head dim"),
    ("sigmoid_weights", "inaccurate", "do not sum to 1"),
    ("softmax_over_queries", "inaccurate", "over the queries axis"),
    ("fused_flat_reshape", "mixes-queries", "across the batch"),
    ("LogSoftmaxWeights", "inaccurate", "no reading the check knows explains it"),
])
def test_wrong_modules_are_found_with_their_cause(name, code, words):
    report = _check(name)
    assert report.codes == [code], report.text()
    assert words in report.findings[0].message
    assert report.oracle["compared"] is True
    assert "every case agrees with the oracle" not in report.text()
    # The reproducer runs as printed and fails while the bug is there.
    with pytest.raises(AssertionError):
        exec(compile(report.findings[0].reproducer, "<reproducer>", "exec"),
             {"__name__": "__reproducer__"})


@pytest.mark.parametrize("name, structure", [
    ("Separate", "separate q/k/v nn.Linear, 4 heads of 4, output projection with bias"),
    ("separate_no_bias", "output projection without bias"),
    ("FusedQKV", "fused qkv nn.Linear, chunks in qkv order"),
    ("fused_vqk", "fused qkv nn.Linear, chunks in vqk order"),
    ("fused_interleaved", "fused qkv nn.Linear, per head (qkv) interleaved"),
    ("fused_causal", ", causal"),
    ("GroupedQuery", "4 heads of 4, 2 key/value heads"),
    ("GroupedByRepeat", "query head h on key/value head h % Hkv"),
    ("Cross", "separate q/k/v nn.Linear"),
    ("TorchWrapper", "torch.nn.MultiheadAttention (attn), 4 heads of 4"),
    ("seq_first_wrapper", "torch.nn.MultiheadAttention (attn)"),
    ("QAndFusedKV", "q nn.Linear and a fused kv nn.Linear"),
    ("two_heads_instance", "2 heads of 8"),  # no attribute names the heads: any that fits
    ("CausalCross", ", causal"),  # m(query, key, value), causal inside, not probed as such
    ("WithResidual", "then a step after it that is not read"),  # the core is compared
    ("TimmStyle", "fused qkv nn.Linear, chunks in qkv order"),
])
def test_correct_modules_agree_with_the_oracle(name, structure):
    report = _check(name)
    assert report.findings == [], report.text()
    assert report.oracle["compared"] is True and structure in report.oracle["structure"]
    assert "compared with the float64 oracle from the module's own weights" in report.text()
    assert "every case agrees with the oracle" in report.text()


@pytest.mark.parametrize("name", ["ListOfFour", "FoldedHeads", "BertStyleNoOutput"])
def test_tutorial_structures_agree_with_the_oracle(name):
    # Both fill masked scores with finfo.min: a uniform row where no key is allowed, a
    # warning (peers disagree); nothing about the oracle.
    report = _check(name)
    assert set(report.codes) <= {"fully-masked-row"}, report.text()
    assert report.oracle["compared"] is True
    assert "separate q/k/v nn.Linear, 4 heads of 4" in report.oracle["structure"]


@pytest.mark.parametrize("factory, structure", [
    (at.MultiHeadAttention, "attnkit MultiHeadAttention, 4 heads of 4"),
    (lambda E, H: at.MultiHeadAttention(E, H, num_kv_heads=2), "2 key/value heads"),
    (lambda E, H: at.MultiHeadAttention(E, H, bias=False), "attnkit MultiHeadAttention"),
    (lambda E, H: at.MultiheadAttention(E, H, batch_first=True),
     "torch.nn.MultiheadAttention, 4 heads of 4"),
])
def test_attnkit_and_torch_layers_agree_with_the_oracle(factory, structure):
    report = check_multi_head(factory)
    assert report.findings == [], report.text()
    assert report.oracle["compared"] is True and structure in report.oracle["structure"]


@pytest.mark.parametrize("name, why", [
    ("Rotary", "the outputs depend on the positions"),
    ("QKNorm", "LayerNorm (q_norm)"),
    ("RawParams", "projections written with raw parameters"),
    ("Additive", "only dot-product attention is compared"),
    ("MemoryKeys", "parameters outside its nn.Linear layers (mem_k, mem_v)"),
])
def test_unreadable_modules_are_not_compared_and_not_blamed(name, why):
    report = _check(name)
    assert report.findings == [], report.text()
    assert report.oracle["compared"] is False and why in report.oracle["why"]
    text = report.text()
    assert "not compared with the oracle: " in text
    assert "every case agrees with the oracle" not in text
    assert json.loads(report.to_json())["oracle"] == {"compared": False,
                                                      "why": report.oracle["why"]}
    assert "未与参考实现比较" in report.text(lang="zh")


def test_every_report_carries_the_oracle_status():
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v

    assert json.loads(check_attention(attention).to_json())["oracle"] == {
        "compared": True, "why": ""}
    data = json.loads(_check("Separate").to_json())
    assert data["oracle"]["compared"] is True and data["oracle"]["why"] == ""


def test_oracle_sentences_have_the_same_keys_and_fields_in_english_and_chinese():
    import string

    from attnkit.check.catalogue.en.oracle import TEXTS as EN
    from attnkit.check.catalogue.zh.oracle import TEXTS as ZH

    def fields(template: str) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name}

    assert set(EN) == set(ZH)
    for key in EN:
        assert fields(EN[key]) == fields(ZH[key]), key


def test_dropout_left_on_after_the_output_projection_gets_one_code():
    # The check seeds every call alike, so the core (before the dropout) is compared and
    # agrees; the dropout probe names the bug.
    report = _check("DropoutAlwaysOn")
    assert report.codes == ["dropout-in-eval"], report.text()
    assert "then a step after it that is not read" in report.oracle["structure"]


def test_the_oracle_line_is_written_in_chinese():
    zh = _check("GroupedQuery").text(lang="zh")
    assert ("已用模块自己的权重与 float64 参考实现比较：q/k/v 各一个 nn.Linear，"
            "4 个头，每头 4 维，2 个键/值头，输出投影不带偏置") in zh
    zh = _check("QKNorm").text(lang="zh")
    assert "未与参考实现比较：forward 中除投影外还运行了 LayerNorm（q_norm，一种规范化）" in zh
    assert "heads of" not in zh and "runs in forward" not in zh


@pytest.mark.parametrize("name", ["width_scale", "sigmoid_weights", "fused_flat_reshape"])
def test_oracle_findings_are_written_in_chinese(name):
    zh = _check(name).text(lang="zh", reproducers=False)
    detail = [line for line in zh.splitlines() if line.strip().startswith(("详情", "实测", "用例"))]
    assert len(detail) == 3 and all("the " not in line for line in detail), zh


def test_what_was_compared_is_named_in_the_reports_language():
    # The measured line names the attention core in Chinese too (it was written as the
    # English field "attention core" inside a Chinese sentence).
    report = check_multi_head(load_target(f"{FILE}:LogSoftmaxWeights"))
    measured = [str(f.measured) for f in report.findings]
    assert any(m.startswith("attention core: max error") for m in measured), report.table()
    zh = report.text(lang="zh")
    assert "注意力核心：最大误差" in zh and "attention core" not in zh, zh
