"""attnkit.testing.assert_close_by_rule: the 2x/3x/5x rule must be able to fail."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.testing import assert_close_by_rule

REF = np.array([1.0, 2.0, 3.0, 4.0])
BASE = REF + np.array([1e-3, -1e-3, 0.0, 0.0])


def test_within_the_rule_passes_and_beyond_it_fails() -> None:
    assert_close_by_rule(REF + 1.9e-3, REF, BASE, factor=2, atol=0.0)
    with pytest.raises(AssertionError, match=r"max error 2\.100e-03.*exceeds 2 x"):
        assert_close_by_rule(REF + 2.1e-3, REF, BASE, factor=2, atol=0.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_baseline_entry_does_not_lift_the_bound(bad) -> None:
    """A NaN (inf) in the baseline made its max error NaN (inf): the bound became NaN
    (inf) and any error at all passed."""
    base = BASE.copy()
    base[3] = bad
    with pytest.raises(AssertionError, match="exceeds"):
        assert_close_by_rule(REF + 1.0, REF, base, factor=2, atol=0.0)


def test_nan_must_propagate_where_the_reference_has_it() -> None:
    ref = REF.copy()
    ref[1] = np.nan
    assert_close_by_rule(ref, ref, ref, factor=2)
    with pytest.raises(AssertionError, match="1 finite where the reference is NaN"):
        assert_close_by_rule(REF, ref, ref, factor=2)
    with pytest.raises(AssertionError, match="1 NaN where the reference has none"):
        assert_close_by_rule(ref, REF, REF, factor=2)
