"""``check_multi_head`` on cross-attention written ``forward(x, memory, memory_mask=None)``:
two inputs, the second both key and value. It was read as ``m(query, key, value)``, the
mask slot got a tensor of activations and the report was a false ``call-failed``; now the
module is called with the query and the memory, compared with the oracle, and a wrong one
of the same shape is still found."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_multi_head, load_target  # noqa: E402

from .reproducers import raises_as_printed  # noqa: E402

FILE = "tests/check/impl_calls/memory_inputs.py"

pytestmark = pytest.mark.usefixtures("at_root")


@pytest.mark.parametrize("name", ["DecoderCross", "TgtMemory"])
def test_correct_query_memory_module_has_no_finding(name):
    report = check_multi_head(load_target(f"{FILE}:{name}"))
    assert report.codes == [], report.text()
    assert report.oracle["compared"] is True, report.oracle


def test_unscaled_query_memory_module_is_wrong_scale():
    report = check_multi_head(load_target(f"{FILE}:unscaled"))
    assert report.codes == ["wrong-scale"], report.text()
    assert isinstance(raises_as_printed(report.findings[0].reproducer), AssertionError), \
        report.findings[0].reproducer


def test_a_position_input_is_not_read_as_a_memory():
    """Read as (query, memory), forward(src, pos) got false shape and mixes-queries errors:
    its 'memory' (the position embedding) must be as long as the queries."""
    report = check_multi_head(load_target(f"{FILE}:SelfWithPosition"))
    assert not {"shape", "mixes-queries", "inaccurate"} & set(report.codes), report.text()


def test_a_module_that_cannot_be_called_is_not_compared():
    """A report whose check stopped at the first call said ``"compared": true``: the
    default of a report, never replaced since the oracle probe never ran."""
    report = check_multi_head(load_target(f"{FILE}:SelfWithPosition"))
    assert "call-failed" in report.codes, report.text()
    assert report.oracle["compared"] is False, report.oracle
    assert "stopped before the comparison" in str(report.oracle["why"]), report.oracle
    assert report.to_dict()["oracle"]["compared"] is False
