"""What an attention or softmax whose output misses the oracle computes instead, read from
its behaviour: each reading is a computation the output matches within the 2x rule, or a
probe of which inputs move the output. They run only where the output is already wrong (a
right output never gets here), after the readings of :mod:`.readings`.

- ``mask-ignored``: the output (or the returned weights) is attention over every key;
- ``query-axis``: the softmax normalised each key's column over the queries;
- ``lens-on-queries`` / ``first-length``: the valid lengths cut the queries, or every query
  reads query 0's length of a per-query ``valid_lens (B, Tq)``;
- ``parts-averaged`` / ``parts-unnormalised`` / ``blocks-not-rescaled``: the keys taken in
  parts, each normalised on its own, and the parts merged with the wrong weights;
- ``zero-slots``: the keys a query must not see attended as zero vectors with zero values;
- ``unread-keys``: keys the oracle attends that move no output at all;
- ``lse-max-not-added``: a softmax whose rows come out multiplied by ``exp(row max)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..catalogue import T, Text

__all__ = ["explain_attention", "explain_masked_softmax", "explain_weights", "same_reading",
           "times_row_max", "unread_keys"]

_MAX_PROBED_KEYS = 64  # one call per key position: longer cases are not probed


def same_reading(small: Text | str, found: Text | str) -> bool:
    """Whether the smaller case's sentence may stand for ``found``'s: not when ``found``
    names a reading of this module and the smaller case another (on fewer keys and queries
    two readings can coincide: valid_lens cutting the queries looks like no mask at all)."""
    key = getattr(found, "key", "")
    return key not in READING_KEYS or getattr(small, "key", "") == key


READING_KEYS = frozenset({
    "judge.mask-ignored", "judge.weights-unmasked", "judge.query-axis",
    "judge.lens-on-queries", "judge.first-length", "judge.parts-averaged",
    "judge.parts-unnormalised", "judge.blocks-not-rescaled", "judge.zero-slots",
    "judge.unread-keys", "judge.lse-max-not-added"})


def _softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(s, axis=axis, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def _scores(a: dict) -> np.ndarray:
    q, k = a["q"].astype(np.float64), a["k"].astype(np.float64)
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def _parts(Tk: int) -> list[list[tuple[int, int]]]:
    """Ways to cut ``Tk`` keys into contiguous parts: in two (every split point), and in
    blocks of ``c`` keys (the last one shorter)."""
    cuts = [[(0, c), (c, Tk)] for c in range(1, Tk)]
    for c in range(1, Tk):
        blocks = [(j, min(j + c, Tk)) for j in range(0, Tk, c)]
        if len(blocks) > 2:
            cuts.append(blocks)
    return cuts


def _merged(s: np.ndarray, v: np.ndarray, parts: list[tuple[int, int]]) -> dict:
    """The three wrong merges of per-part softmaxes: equal average, weights exp(lse_p -
    max lse) that do not sum to 1, and the running sums never rescaled."""
    outs, lses = [], []
    for j0, j1 in parts:
        sp = s[..., j0:j1]
        m = sp.max(-1, keepdims=True)
        e = np.exp(sp - m)
        outs.append(e / e.sum(-1, keepdims=True) @ v[..., j0:j1, :])
        lses.append(m + np.log(e.sum(-1, keepdims=True)))
    top = np.max(lses, axis=0)
    m_run = np.full(s.shape[:-1] + (1,), -np.inf)
    acc, total = 0.0, 0.0
    for j0, j1 in parts:
        m_run = np.maximum(m_run, s[..., j0:j1].max(-1, keepdims=True))
        p = np.exp(s[..., j0:j1] - m_run)
        acc, total = acc + p @ v[..., j0:j1, :], total + p.sum(-1, keepdims=True)
    return {"judge.parts-averaged": sum(outs) / len(outs),
            "judge.parts-unnormalised": sum(np.exp(x - top) * o for x, o in zip(lses, outs)),
            "judge.blocks-not-rescaled": acc / total}


def explain_attention(a: dict, keep: np.ndarray, got: np.ndarray,
                      fits: Callable[[np.ndarray], bool],
                      fits_keep: Callable[[Any], bool]) -> Text | None:
    """The reading of an attention output that misses the oracle, as the sentence that says
    what to fix; None when none fits. ``fits(alt)``: ``alt`` is within the rule;
    ``fits_keep(keep)``: attention with that keep-mask is."""
    if not keep.all() and fits_keep(None):
        return T("judge.mask-ignored")
    s, v = _scores(a), a["v"].astype(np.float64)
    with np.errstate(all="ignore"):
        if keep.all():
            if fits(_softmax(s, axis=-2) @ v):
                return T("judge.query-axis")
            Tk = s.shape[-1]
            for parts in _parts(Tk) if Tk <= _MAX_PROBED_KEYS else []:
                for key, alt in _merged(s, v, parts).items():
                    if fits(alt):
                        return T(key, size=parts[0][1], n=len(parts))
        else:
            w = _softmax(np.where(keep, s, 0.0))  # an unseen slot's key: score 0
            if fits((w * keep) @ v):  # and its value: a zero vector
                return T("judge.zero-slots")
    return None


def explain_masked_softmax(a: dict, got: np.ndarray,
                           fits_keep: Callable[[Any], bool]) -> Text | None:
    """A masked softmax that ignores its mask, whose valid lengths cut the queries instead
    of the keys (the cut rows all 0), or whose per-query lengths ``(B, Tq)`` are all read
    from query 0."""
    lens = a.get("valid_lens")
    if lens is None:
        return T("judge.mask-ignored") if fits_keep(None) else None
    x = a["x"]
    Tq, Tk = x.shape[-2], x.shape[-1]
    if lens.ndim == 1:
        rows = np.broadcast_to(np.arange(Tq)[None, :, None] < lens[:, None, None], x.shape)
        if (~rows).any() and fits_keep(rows) and np.abs(
                np.nan_to_num(got[~rows], nan=1.0)).max() <= 1e-6:
            return T("judge.lens-on-queries")
    elif lens.ndim == 2 and Tq > 1:
        first = np.arange(Tk)[None, None, :] < lens[:, :1, None]
        if fits_keep(np.broadcast_to(first, x.shape)):
            return T("judge.first-length")
    return T("judge.mask-ignored") if fits_keep(None) else None


def explain_weights(a: dict, keep: np.ndarray, weights: np.ndarray, bound: float) -> Text | None:
    """Returned weights that miss the oracle's but are the softmax over every key: the
    weights' softmax forgot the mask."""
    if keep.all() or weights.shape != keep.shape:
        return None
    with np.errstate(all="ignore"):
        alt = _softmax(_scores(a))
    if np.isfinite(weights).all() and np.abs(weights - alt).max() <= bound:
        return T("judge.weights-unmasked")
    return None


def unread_keys(a: dict, keep: np.ndarray, got: np.ndarray,
                output: Callable[[dict], np.ndarray | None]) -> Text | None:
    """Key positions the oracle attends (some query may) whose keys and values move no
    output: the code never reads them. ``output(arrays)``: the function's output on other
    arrays (None when it cannot be called)."""
    Tk = a["k"].shape[-2]
    if Tk > _MAX_PROBED_KEYS or Tk < 2:
        return None
    g = np.random.default_rng(23)
    unread = []
    for j in range(Tk):
        rows = keep[..., j]  # the outputs key j should move
        if not rows.any():
            continue
        b = dict(a)
        for name in ("k", "v"):
            x = a[name].copy()
            x[..., j, :] += 1.0 + g.standard_normal(x[..., j, :].shape)
            b[name] = x.astype(a[name].dtype)
        moved = output(b)
        if moved is None or moved.shape != got.shape:
            return None
        change = np.abs(np.nan_to_num(moved) - np.nan_to_num(got)).max(-1)
        if change[np.broadcast_to(rows, change.shape)].max() <= 1e-12:
            unread.append(j)
    if not unread:
        return None
    return T("judge.unread-keys", keys=", ".join(map(str, unread)), Tk=Tk)


def times_row_max(x: np.ndarray, got: np.ndarray, bound: float) -> bool:
    """``got`` is the softmax of ``x`` times ``exp(row max)``: ``exp(x - lse)`` with an
    lse that subtracted the row maximum and never added it back. Only rows whose maximum
    is away from 0 tell it apart from a right softmax."""
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    if got.shape != x.shape or not np.isfinite(got).all() or np.abs(m).max() < 0.1:
        return False
    e = np.exp(x - m)
    alt = e / e.sum(-1, keepdims=True) * np.exp(m)
    return bool(np.isfinite(alt).all() and np.abs(alt - got).max() <= bound * max(
        1.0, float(np.exp(m).max())))
