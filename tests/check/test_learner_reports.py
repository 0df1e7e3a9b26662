"""Reports as a learner meets them in a notebook: a function defined there gets a reproducer
that runs in that notebook, a plainly wrong result is called wrong (not imprecise) and its
reproducer shows both results, and a multi-head class handed to the function check is sent
to the multi-head check."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from attnkit.check import check_attention, check_softmax

SOURCE = """
import numpy as np


def my_softmax(x):
    e = np.exp(x)                      # no max subtracted
    return e / e.sum(-1, keepdims=True)


def sum_everything(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / np.sum(e)               # no axis: divides by the sum of the whole array
"""


def notebook() -> dict:
    """A namespace like a Jupyter kernel's: its functions belong to no importable module,
    so nothing can load them again from a file."""
    ns = {"__name__": "__notebook_cells__"}
    exec(compile(SOURCE, "<notebook cell>", "exec"), ns)
    return ns


def test_a_function_defined_in_a_notebook_gets_a_reproducer_that_runs_there():
    ns = notebook()
    report = check_softmax(ns["my_softmax"])
    assert report.codes == ["nan-or-inf"], report.text()
    repro = report.findings[0].reproducer
    assert "fn = my_softmax" in repro and "fn = ..." not in repro
    assert "load_target" not in repro  # nothing to load: the function is right there
    with pytest.raises(AssertionError):
        exec(repro, dict(ns))


def test_a_plainly_wrong_result_is_called_wrong_and_the_reproducer_shows_both():
    ns = notebook()
    report = check_softmax(ns["sum_everything"])
    assert report.codes == ["inaccurate"], report.text()
    finding = report.findings[0]
    assert "wrong, not just imprecise" in finding.message
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(AssertionError):
        exec(finding.reproducer, dict(ns))
    printed = out.getvalue()
    assert "fn:" in printed and "oracle:" in printed, printed


def test_a_function_named_softmax_is_the_one_its_reproducer_runs():
    """The exercise's own name: the oracle's import must not shadow the learner's
    ``softmax`` (the reproducer would then test attnkit's, and pass)."""
    ns = notebook()
    exec(compile("def softmax(x):\n    return sum_everything(x)\n", "<notebook cell>", "exec"),
         ns)
    report = check_softmax(ns["softmax"])
    assert report.codes == ["inaccurate"], report.text()
    repro = report.findings[0].reproducer
    assert "fn = softmax" in repro, repro
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(AssertionError):
        exec(repro, dict(ns))


class MultiHead:
    """A multi-head module's constructor, handed to the function check by mistake."""

    def __init__(self, d_model, num_heads):
        self.d_model, self.num_heads = d_model, num_heads

    def __call__(self, q, k, v):
        return q


def test_a_multi_head_class_given_to_the_function_check_is_sent_to_the_multi_head_check():
    report = check_attention(MultiHead)
    assert report.codes == ["call-failed"], report.text()
    assert "attnkit check multi-head" in report.findings[0].message


def test_an_imprecise_but_right_result_keeps_the_precision_wording():
    def rounded_softmax(x):  # right formula, rounded to 3 decimals: imprecise, not wrong
        e = np.exp(x - x.max(-1, keepdims=True))
        return np.round(e / e.sum(-1, keepdims=True), 3)

    report = check_softmax(rounded_softmax)
    assert "inaccurate" in report.codes, report.text()
    message = report.findings[report.codes.index("inaccurate")].message
    assert "further from the oracle" in message and "not just imprecise" not in message
