"""``--json --lang zh``: every sentence of the JSON report is Chinese, the names of the
cases run included (they stayed English); the English JSON is as it was."""

from __future__ import annotations

import json

import numpy as np

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
