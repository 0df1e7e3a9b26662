"""A function that runs into mismatched shapes inside itself on every input layout is a
``shape`` bug (a sum without keepdims, a missing transpose), not ``call-failed``; one that
cannot be called at all stays ``call-failed``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from attnkit.check import check_attention, check_softmax  # noqa: E402


def softmax_sum_without_keepdims(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1)  # (..., T) / (...,): does not broadcast


def attention_k_not_transposed(q, k, v):
    s = np.matmul(q, k) / np.sqrt(q.shape[-1])  # q @ k, not q @ k^T: (Tq, D) @ (Tk, D)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def wants_dicts(q, k, v):
    return q["hidden"] @ k["hidden"]  # not arrays it wanted: no call the check can make


def test_a_shape_error_inside_is_shape():
    for check, fn in ((check_softmax, softmax_sum_without_keepdims),
                      (check_attention, attention_k_not_transposed)):
        report = check(fn)
        assert report.codes == ["shape"], report.table()
        assert "shape error" in report.findings[0].message


def test_a_call_that_cannot_be_made_stays_call_failed():
    assert check_attention(wants_dicts).codes == ["call-failed"]
