"""d2l's per-query lengths ``valid_lens (B, Tq)``: with ``per_query_lens=True`` the checks
pass them besides ``(B,)``; a function that reads lengths per batch row only is told so
(``shape`` when it raises, ``inaccurate`` when it gives other numbers), with a reproducer
that fails as printed; functions that take both shapes, and every check without the flag,
are unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnkit.numpy as an  # noqa: E402
from attnkit.check import check_attention, check_masked_softmax, load_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def raises_as_printed(code: str, fn) -> BaseException | None:
    # imported here: the checker also loads this file as a target, outside its package
    from .reproducers import raises_as_printed

    return raises_as_printed(code, fn=fn)


def _runnable(code: str) -> str:
    return code.replace("fn = ...", "pass  #")  # the placeholder line: fn is given


def lens_both(X, valid_lens):
    """Correct for (B,) and (B, Tq)."""
    B, Tq, Tk = X.shape
    if valid_lens.ndim == 1:
        valid_lens = np.broadcast_to(valid_lens[:, None], (B, Tq))
    keep = np.arange(Tk) < valid_lens[..., None]
    s = np.where(keep, X, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def lens_batch_only(X, valid_lens):
    """Correct for (B,); (B, Tq) does not broadcast against (B, 1, 1)."""
    keep = np.arange(X.shape[-1]) < valid_lens[:, None, None]
    s = np.where(keep, X, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def lens_last_query(X, valid_lens):
    """(B, Tq) read as the last query's length for every query: runs, wrong numbers."""
    lens = valid_lens if valid_lens.ndim == 1 else valid_lens[:, -1]
    return lens_batch_only(X, lens)


def attention_lens_both(q, k, v, valid_lens=None):
    """NumPy attention, (B, T, D) as d2l's bmm, with lengths of either shape."""
    if q.ndim != 3:
        raise ValueError(f"(B, T, D) inputs only, got q {q.shape}")
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return (an.softmax(s) if valid_lens is None else lens_both(s, valid_lens)) @ v


def attention_lens_batch_only(q, k, v, valid_lens=None):
    if q.ndim != 3:
        raise ValueError(f"(B, T, D) inputs only, got q {q.shape}")
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return (an.softmax(s) if valid_lens is None else lens_batch_only(s, valid_lens)) @ v


@pytest.mark.parametrize("fn", [lens_both, an.masked_softmax,
                                load_target(f"{ROOT}/examples/check/masked_softmax.py:"
                                            "masked_softmax")],
                         ids=["numpy", "attnkit", "torch-example"])
def test_functions_that_take_both_shapes_get_no_finding(fn):
    report = check_masked_softmax(fn, convention="valid_lens", per_query_lens=True)
    assert report.findings == [], report.table()
    assert any("valid_lens (B, Tq)" in c for c in report.cases), report.cases


def test_batch_lengths_only_raises_and_is_told_so():
    assert check_masked_softmax(lens_batch_only).findings == []  # (B,) alone: correct
    report = check_masked_softmax(lens_batch_only, per_query_lens=True)
    assert report.codes == ["shape"], report.table()
    finding = report.findings[0]
    assert "per-query lengths (B, Tq)" in finding.message and "(B,)" in finding.message
    assert "valid_lens (B, Tq)" in finding.case
    assert isinstance(raises_as_printed(_runnable(finding.reproducer), lens_batch_only),
                      ValueError), finding.reproducer


def test_one_length_for_every_query_is_inaccurate_and_told_so():
    report = check_masked_softmax(lens_last_query, per_query_lens=True)
    assert report.codes == ["inaccurate"], report.table()
    finding = report.findings[0]
    assert "per-query lengths (B, Tq)" in finding.message
    assert isinstance(raises_as_printed(_runnable(finding.reproducer), lens_last_query),
                      AssertionError), finding.reproducer


def test_attention_with_per_query_lengths():
    assert check_attention(attention_lens_both, per_query_lens=True).findings == []
    report = check_attention(attention_lens_batch_only, per_query_lens=True)
    assert report.codes == ["shape"] and "(B, Tq)" in report.findings[0].message, \
        report.table()
    assert check_attention(attention_lens_batch_only).findings == []


def test_per_query_lengths_need_the_valid_lens_convention():
    def keep_mask(x, mask):
        return an.masked_softmax(x, mask=mask)

    with pytest.raises(ValueError, match="per_query_lens=True"):
        check_masked_softmax(keep_mask, convention="keep", per_query_lens=True)


def test_the_command_takes_per_query_lens(capsys, monkeypatch):
    from attnkit.cli import main

    monkeypatch.chdir(ROOT)
    target = "tests/check/test_per_query_lens.py:lens_batch_only"
    assert main(["check", "masked-softmax", target]) == 0
    capsys.readouterr()
    assert main(["check", "masked-softmax", target, "--per-query-lens"]) == 1
    assert "per-query lengths (B, Tq)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["check", "softmax", "examples/check/softmaxes.py:softmax", "--per-query-lens"])
    assert "--per-query-lens applies to" in capsys.readouterr().err
