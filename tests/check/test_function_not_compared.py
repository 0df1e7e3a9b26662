"""A function check that stops before any case is judged (the function cannot be called)
says ``"compared": false`` and why; it kept the report's default ``"compared": true``."""

from __future__ import annotations

import numpy as np

from attnkit.check import check_attention, check_softmax


def needs_a_config(q, k, v, config):
    raise RuntimeError("config.attn_scale is required")


def test_a_function_that_cannot_be_called_is_not_compared():
    report = check_attention(needs_a_config)
    assert report.codes == ["call-failed"], report.text()
    assert report.oracle["compared"] is False, report.oracle
    assert report.to_dict()["oracle"]["compared"] is False


def test_a_function_that_is_judged_is_compared():
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    report = check_softmax(softmax)
    assert report.ok, report.text()
    assert report.oracle["compared"] is True, report.oracle
