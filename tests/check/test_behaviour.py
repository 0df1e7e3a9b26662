"""What a wrong attention or softmax computes instead, named from its behaviour (each one a
look-alike of a slip people make), and a correct function still gets no finding."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.check import check_attention, check_masked_softmax, check_softmax


def _sm(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _masked(s, keep):
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def _scores(q, k):
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def attention_right(q, k, v, mask):
    """True = may attend, an empty row gives 0."""
    return _masked(_scores(q, k), mask) @ v


def attention_mask_unused(q, k, v, mask):
    return _sm(_scores(q, k)) @ v


def attention_over_queries(q, k, v):
    return _sm(_scores(q, k), axis=-2) @ v


def attention_halves_averaged(q, k, v):
    h = k.shape[-2] - k.shape[-2] // 2
    s = _scores(q, k)
    return (_sm(s[..., :h]) @ v[..., :h, :] + _sm(s[..., h:]) @ v[..., h:, :]) / 2


def attention_first_keys_only(q, k, v):
    """Reads at most 2 keys, as a loop whose bound is off."""
    n = min(2, k.shape[-2])
    return _sm(_scores(q, k[..., :n, :])) @ v[..., :n, :]


def attention_pads_with_zeros(q, k, v, attn_mask=None, is_causal=False):
    """A causal step that attends a zero-filled buffer instead of leaving the future out."""
    s = _scores(q, k)
    if is_causal:
        Tq, Tk = s.shape[-2:]
        keep = np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)
        s = np.where(keep, s, 0.0)
        return _sm(s) @ v * 0 + (_sm(s) * keep) @ v
    keep = None if attn_mask is None else attn_mask
    return (_sm(s) if keep is None else _masked(s, keep)) @ v


def masked_softmax_rows_cut(X, valid_lens):
    keep = np.arange(X.shape[1])[None, :, None] < valid_lens[:, None, None]
    return _masked(X, np.broadcast_to(keep, X.shape))


def softmax_lse_forgot_max(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    with np.errstate(all="ignore"):
        return np.exp(x - np.log(np.exp(x - m).sum(-1, keepdims=True)))


CASES = [
    (lambda: check_attention(attention_mask_unused, convention="keep"), "never reaches"),
    (lambda: check_attention(attention_over_queries), "over the queries"),
    (lambda: check_attention(attention_halves_averaged), "plain average"),
    (lambda: check_attention(attention_first_keys_only), "changes no output"),
    (lambda: check_attention(attention_pads_with_zeros), "zero vector"),
    (lambda: check_masked_softmax(masked_softmax_rows_cut), "cuts the queries"),
    (lambda: check_softmax(softmax_lse_forgot_max), "added back"),
]


@pytest.mark.parametrize("run, words", CASES, ids=[w for _, w in CASES])
def test_the_mistake_is_named_in_both_languages(run, words):
    report = run()
    assert not report.ok, report.text()
    assert any(words in f.message for f in report.findings), report.text()
    assert all("check the formula" not in f.message for f in report.findings
               if words in f.message)
    assert report.text(lang="zh") != report.text()


def test_a_right_attention_with_a_mask_has_no_finding():
    report = check_attention(attention_right, convention="keep")
    assert report.ok and report.findings == [], report.text()
