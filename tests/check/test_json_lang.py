"""``--json --lang zh``: every sentence of the JSON report is Chinese, the names of the
cases run included (they stayed English); the English JSON is as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnkit.check import check_softmax


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_cases_run_are_named_in_the_language(english_in):
    report = check_softmax(softmax)
    zh = json.loads(report.to_json("zh"))["cases"]
    en = json.loads(report.to_json("en"))["cases"]
    assert len(zh) == len(en) == len(report.cases) > 3
    assert en == [str(c) for c in report.cases]
    left = [s for case in zh for s in english_in(case)]
    assert not left, zh
    assert zh != en


def test_the_chinese_guard_reads_two_words_and_leaves_code_and_names(english_in):
    assert english_in("请在最后一维（键，last axis）上做 softmax") == ["last axis"]
    assert english_in("详情：a wrong shape") == ["wrong shape"]
    # symbols, names and commands, and Chinese text right next to code, are no sentence
    assert not english_in("只保留 j <= i + Tk - Tq 的键；PyTorch SDPA；Dk != Dv")
    assert not english_in("attnkit 检查模型：--tiny llama")


@pytest.mark.english_report  # made by hand from English words, to be found
def test_the_chinese_guard_reads_every_sentence_of_the_json():
    from attnkit.check.core.report import Finding, Report
    from attnkit.check.render.json import report_dict

    from .conftest import english_sentences, json_sentences

    report = Report("softmax", "by_hand")
    report.add(Finding("shape", "a wrong shape", "got (2, 3)"))
    data = report_dict(report, "zh", literal=lambda s: "…")
    found = {path for path, text in json_sentences(data) if english_sentences(text)}
    assert found == {".findings[0].message"}, found


def test_a_function_in_named_layers_is_named_in_the_language():
    pytest.importorskip("torch")
    from attnkit.check.catalogue import render
    from attnkit.check.model.any_model import implementation_label

    def unscaled(*args):
        return args

    label = implementation_label({"blocks.2.*": unscaled})
    assert label == f"{unscaled.__qualname__} in blocks.2.*"
    assert render(label, "zh") == f"blocks.2.* 中的 {unscaled.__qualname__}"
