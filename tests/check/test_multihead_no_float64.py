"""``check_multi_head`` on a correct module that does not run in float64: the float64
finite differences of its gradients are the check's own tool, so they are skipped (the
gradients are still checked for existence and finiteness); they were reported as a false
``call-failed``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_multi_head, load_target  # noqa: E402

pytestmark = pytest.mark.usefixtures("at_root")


def test_a_module_that_refuses_float64_has_no_finding():
    report = check_multi_head(load_target("tests/check/impl_calls/no_float64.py:KernelDtypesOnly"))
    assert report.codes == [], report.text()
    assert report.oracle["compared"] is True, report.oracle


def test_a_probe_that_raises_is_named_as_the_case_it_stopped_in():
    """The call-failed finding named the case before (the bfloat16 copy), not the
    gradients probe whose call raised."""
    report = check_multi_head(load_target("tests/check/impl_calls/no_float64.py:NumpyInForward"))
    failed = [f for f in report.findings if f.code == "call-failed"]
    assert failed, report.text()
    assert str(failed[0].case).startswith("gradients"), failed[0].case
