"""The model checks walk the spine every check shares (``attnkit.check.core.spine``):
walked by hand, step by step, each gives the report ``check_model`` gives, and every
finding reaches the result of the implementation it was found under."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers",
                    reason="check model needs `pip install attnkit[transformers]`")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lookalikes as L  # noqa: E402
from model_faults import register_faults  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import T  # noqa: E402
from attnkit.check.core.report import Finding  # noqa: E402
from attnkit.check.model.any_model import AnyModelCheck, check_any_model  # noqa: E402
from attnkit.check.model.check import ModelCheck  # noqa: E402
from attnkit.check.model.load import inputs_for, tiny_model  # noqa: E402
from attnkit.check.model.report import (  # noqa: E402
    ImplementationResult,
    ModelFinding,
    ModelReport,
)


def _same(a: ModelReport, b: ModelReport) -> None:
    da, db = a.to_dict(), b.to_dict()
    da.pop("seconds")
    db.pop("seconds")
    assert da == db


def test_check_model_walked_by_hand_gives_check_models_report(tmp_path):
    register_faults()
    model = tiny_model("llama")
    impls = ["eager", "fault-flip-layer-1"]
    inputs, described = inputs_for(model, None, 0, 2, 12, "left", 0)
    report = ModelReport("LlamaForCausalLM", "float32", described + T("model.prefill-only"))
    check = ModelCheck(model, inputs, impls, report, generate=0, sample=None,
                       save_to=tmp_path, progress=False, generate_api=False)
    try:
        assert check.prepare()
        cases = check.cases()
        assert [(s.impl, s.reference) for s in cases] == [(impls[0], True), (impls[1], False)]
        assert list(check.judge(cases[0])) == []  # the reference is right
        found = list(check.judge(cases[1]))
        assert [(f.code, f.layer) for f in found] == [("mask-polarity",
                                                      "model.layers.1.self_attn")]
        assert report.implementations[1].findings == []  # the spine adds them
        for f in found:
            report.add(f)
        assert report.implementations[0].findings == []
        assert report.implementations[1].findings == found
        check.finish()
    finally:
        check.close()
    _same(report, check_model(model, implementations=impls, save_to=tmp_path,
                              progress=False))  # the same random inputs


def test_check_any_model_walked_by_hand_gives_the_same_report(tmp_path):
    torch.manual_seed(0)
    gpt, ids = L.GPT(), L.tokens()
    check = AnyModelCheck(gpt, (ids,), L.unscaled, tmp_path, "GPT")
    assert check.prepare()
    (case,) = check.cases()
    found = list(check.judge(case))
    assert [f.code for f in found] == ["wrong-scale"]
    assert found[0].reproducer and Path(case.result.reproducer).is_file()
    for f in found:
        check.report.add(f)
    check.finish()
    assert check.report.codes == ["wrong-scale"]
    _same(check.report, check_any_model(gpt, (ids,), implementation=L.unscaled,
                                        save_to=tmp_path))


def test_a_model_report_keeps_the_first_finding_of_each_code_errors_first():
    report = ModelReport("m")
    report.implementations += [ImplementationResult("eager"), ImplementationResult("mine")]
    late = ModelFinding("mask-polarity", T("model.polarity"), implementation="mine",
                        layer="layer 1")
    report.add(ModelFinding("fully-masked-row", T("model.empty-nan"), implementation="mine"))
    report.add(ModelFinding("mask-polarity", T("model.polarity"), implementation="mine",
                            layer="layer 0"))
    report.add(late)
    assert report.implementations[0].findings == []
    kept = report.implementations[1].findings
    assert [(f.code, f.layer) for f in kept] == [("mask-polarity", "layer 0"),
                                                 ("fully-masked-row", "")]
    with pytest.raises(TypeError):
        report.add(Finding("inaccurate", T("model.polarity")))
