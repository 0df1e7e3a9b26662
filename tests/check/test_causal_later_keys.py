"""A function declared causal (``causal=True``) whose queries see later keys under a mask
that is not "no mask at all" (``np.triu``, an offset with the wrong sign) gets
``causal-leak``, found by changing only the keys after a query's position; a correct causal
function, and one aligned top-left, are told as before."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import attnkit.numpy as an  # noqa: E402
from attnkit.check import check_attention  # noqa: E402


def _causal_with(keep_of):
    def attention(q, k, v):
        keep = keep_of(q.shape[-2], k.shape[-2])
        return an.scaled_dot_product_attention(q, k, v, mask=keep)[0]
    return attention


def bottom_right(Tq, Tk):
    return np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)


def future_only(Tq, Tk):  # triu: every query sees the keys after it
    return np.triu(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)


def offset_flipped(Tq, Tk):  # right for Tq == Tk; Tq > Tk sees later keys
    return np.tril(np.ones((Tq, Tk), dtype=bool), k=Tq - Tk)


def top_left(Tq, Tk):
    return np.tril(np.ones((Tq, Tk), dtype=bool))


def test_correct_causal_function_gets_no_finding():
    assert check_attention(_causal_with(bottom_right), causal=True).findings == []


@pytest.mark.parametrize("keep_of", [future_only, offset_flipped])
def test_a_query_that_sees_later_keys_is_a_causal_leak(keep_of):
    report = check_attention(_causal_with(keep_of), causal=True)
    assert "causal-leak" in report.codes, report.table()
    finding = next(f for f in report.findings if f.code == "causal-leak")
    assert "later keys" in finding.message


def test_top_left_stays_causal_alignment():
    report = check_attention(_causal_with(top_left), causal=True)
    assert report.codes == ["causal-alignment"], report.table()
