"""The two yardsticks of every verdict: the float64 oracle, and the plain same-precision
math whose error sets the bound (the 2x/3x/5x rule of :func:`attnkit.testing.assert_close_by_rule`).

The oracle is :func:`attnkit.testing.reference_attention` (attention, with gradients) and
:mod:`attnkit.numpy` (softmax, masked softmax, their backward). The baseline is the
textbook formula written once per framework in the checked dtype: scores, ``-inf`` at
masked keys, a max-subtracted softmax, zeros for a row with no key.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...numpy import masked_softmax, softmax
from ...numpy.masks import masked_softmax_backward
from ...numpy.softmax import softmax_backward
from ...testing import assert_close_by_rule, lengths_keep, max_mean_error, reference_attention
from ..catalogue import T, Text, words

__all__ = ["Baseline", "keep_of", "measured_name", "oracle_attention", "oracle_softmax",
           "rule_error"]


def keep_of(inputs: dict[str, np.ndarray], lead: tuple[int, ...], Tq: int, Tk: int) -> np.ndarray:
    """The bool keep-mask (True = may attend) of a case, full shape ``lead + (Tq, Tk)``."""
    if "valid_lens" in inputs:
        return lengths_keep(inputs["valid_lens"], lead, Tq, Tk)
    if "keep" in inputs:
        return np.broadcast_to(inputs["keep"], lead + (Tq, Tk)).copy()
    return np.ones(lead + (Tq, Tk), dtype=bool)


def oracle_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray,
                     scale: float | None = None, d_out: np.ndarray | None = None) -> Any:
    """float64 ``(out, weights, lse, dq, dk, dv)`` (:class:`attnkit.testing.ReferenceResult`)."""
    return reference_attention(q, k, v, mask=keep, scale=scale, d_out=d_out)


def oracle_softmax(x: np.ndarray, keep: np.ndarray | None,
                   d_y: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 ``(y, dx or None)``: softmax over the last axis (allowed entries only)."""
    y = softmax(x) if keep is None else masked_softmax(x, mask=keep)
    if d_y is None:
        return y, None
    dx = softmax_backward(y, d_y) if keep is None else masked_softmax_backward(y, d_y)
    return y, dx


def rule_error(actual: Any, reference: Any, baseline: Any, factor: float,
               name: str) -> Text | None:
    """None when ``actual`` meets the rule (:func:`attnkit.testing.assert_close_by_rule`),
    else what was measured, as a sentence of the catalogue."""
    try:
        assert_close_by_rule(actual, reference, baseline, factor=factor, name=name)
    except AssertionError:
        return _measured(actual, reference, baseline, factor, name)
    return None


def measured_name(name: str) -> Any:
    """What was compared, as the catalogue words it (``"attention core"`` -> 注意力核心 in
    Chinese); a name it has no words for is written as it is."""
    key = "measured.name-" + name.replace(" ", "-")
    return T(key) if key in words("en") else name


def _measured(actual: Any, reference: Any, baseline: Any, factor: float, name: str,
              atol: float = 1e-5) -> Text:
    """Why :func:`attnkit.testing.assert_close_by_rule` failed, with its figures."""
    a, r, b = (np.asarray(x, dtype=np.float64) for x in (actual, reference, baseline))
    what = measured_name(name)
    if a.shape != r.shape:
        return T("measured.rule-shape", name=what, shape=a.shape, want=r.shape)
    nan_a, nan_r = np.isnan(a), np.isnan(r)
    if np.any(nan_a & ~nan_r):
        return T("measured.rule-nan", name=what, n=int(np.sum(nan_a & ~nan_r)))
    if np.any(nan_r & ~nan_a):
        return T("measured.rule-finite", name=what, n=int(np.sum(nan_r & ~nan_a)))
    inf_bad = np.isinf(a) & ~(np.isinf(r) & (np.sign(a) == np.sign(r)))
    if np.any(inf_bad):
        return T("measured.rule-inf", name=what, n=int(np.sum(inf_bad)))
    ok = ~nan_r
    err_max, err_mean = max_mean_error(a[ok], r[ok])
    b_ok = ok & ~np.isnan(b) & ~(np.isinf(b) & ~(np.isinf(r) & (np.sign(b) == np.sign(r))))
    base_max, base_mean = max_mean_error(b[b_ok], r[b_ok])
    return T("measured.rule", name=what, err=err_max, mean=err_mean, factor=factor,
             base=base_max, base_mean=base_mean, atol=atol, bound=factor * base_max + atol)


def bound_of(reference: Any, baseline: Any, factor: float) -> float:
    """The rule's bound: ``factor`` x the baseline's max error + 1e-5."""
    ok = np.isfinite(np.asarray(baseline, dtype=np.float64))
    base = max_mean_error(np.asarray(baseline)[ok], np.asarray(reference)[ok])[0]
    return factor * base + 1e-5


class Baseline:
    """Plain same-precision math in ``framework`` (``"numpy"`` or ``"torch"``), ``dtype``."""

    def __init__(self, framework: str, dtype: str) -> None:
        self.framework, self.dtype = framework, dtype
        if framework == "torch":
            import torch

            self.torch = torch

    def _t(self, x: np.ndarray, grad: bool = False) -> Any:
        t = self.torch.from_numpy(np.asarray(x, dtype=np.float64)).to(
            getattr(self.torch, self.dtype))
        return t.requires_grad_(grad)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray,
                  scale: float | None, d_out: np.ndarray | None = None, *,
                  bias: np.ndarray | None = None, softcap: float | None = None,
                  sinks: np.ndarray | None = None) -> dict:
        """``{"out", "weights"}`` (and ``"dq", "dk", "dv"`` given ``d_out``, PyTorch
        only), as float64 arrays.

        ``bias`` (added after ``softcap``), ``softcap`` and ``sinks`` (``(H,)``, q's axis
        -3) follow the order of every backend; k and v carry q's heads (no GQA here)."""
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        any_key = keep.any(-1, keepdims=True)
        if self.framework == "numpy":
            dt = np.dtype(self.dtype)
            qc, kc, vc = (x.astype(dt) for x in (q, k, v))
            s = (qc @ np.swapaxes(kc, -1, -2)) * dt.type(scale)
            if softcap is not None:
                s = dt.type(softcap) * np.tanh(s / dt.type(softcap))
            if bias is not None:
                s = s + np.asarray(bias).astype(dt)
            s = np.where(keep, s, dt.type(-np.inf))
            if sinks is not None:
                z = np.broadcast_to(np.asarray(sinks).astype(dt).reshape(-1, 1, 1),
                                    s.shape[-3:-1] + (1,))
                s = np.concatenate([s, np.broadcast_to(z, s.shape[:-1] + (1,))], -1)
                keep = np.concatenate([np.broadcast_to(keep, s.shape[:-1] + (s.shape[-1] - 1,)),
                                       np.ones(s.shape[:-1] + (1,), dtype=bool)], -1)
                any_key = np.ones_like(any_key)
            s = s - np.where(any_key, s.max(-1, keepdims=True), dt.type(0))
            e = np.where(keep, np.exp(s), dt.type(0))
            with np.errstate(invalid="ignore", divide="ignore"):
                w = np.where(any_key, e / e.sum(-1, keepdims=True), dt.type(0)).astype(dt)
            if sinks is not None:
                w = w[..., :-1]
            return {"out": (w @ vc).astype(np.float64), "weights": w.astype(np.float64)}
        torch = self.torch
        grad = d_out is not None
        qt, kt, vt = self._t(q, grad), self._t(k, grad), self._t(v, grad)
        kp = torch.from_numpy(np.array(keep))
        s = (qt @ kt.transpose(-1, -2)) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if bias is not None:
            s = s + self._t(np.asarray(bias))
        s = s.masked_fill(~kp, float("-inf"))
        if sinks is not None:  # a value-less column in each row's denominator
            z = self._t(np.asarray(sinks)).reshape(-1, 1, 1).expand(*s.shape[-3:-1], 1)
            s = torch.cat([s, z.expand(*s.shape[:-1], 1)], -1)
            w = torch.softmax(s, dim=-1)[..., :-1]
            w = torch.where(kp, w, torch.zeros((), dtype=s.dtype))
        else:
            s = torch.where(torch.from_numpy(any_key), s, torch.zeros((), dtype=s.dtype))
            w = torch.where(kp, torch.softmax(s, dim=-1), torch.zeros((), dtype=s.dtype))
        out = w @ vt
        result = {"out": out.detach().double().numpy(), "weights": w.detach().double().numpy()}
        if grad:
            out.backward(self._t(d_out))
            for name, t in (("dq", qt), ("dk", kt), ("dv", vt)):
                result[name] = t.grad.double().numpy()
        return result

    def softmax(self, x: np.ndarray, keep: np.ndarray | None,
                d_y: np.ndarray | None = None) -> dict:
        """``{"y"}`` (and ``"dx"`` given ``d_y``, PyTorch only) as float64 arrays."""
        keep = np.ones(x.shape, dtype=bool) if keep is None else np.broadcast_to(keep, x.shape)
        any_key = keep.any(-1, keepdims=True)
        if self.framework == "numpy":
            dt = np.dtype(self.dtype)
            s = np.where(keep, x.astype(dt), dt.type(-np.inf))
            s = s - np.where(any_key, s.max(-1, keepdims=True), dt.type(0))
            e = np.where(keep, np.exp(s), dt.type(0))
            with np.errstate(invalid="ignore", divide="ignore"):
                y = np.where(any_key, e / e.sum(-1, keepdims=True), dt.type(0))
            return {"y": y.astype(np.float64)}
        torch = self.torch
        xt = self._t(x, d_y is not None)
        kp = torch.from_numpy(np.array(keep))
        s = torch.where(torch.from_numpy(any_key), xt.masked_fill(~kp, float("-inf")),
                        torch.zeros((), dtype=xt.dtype))
        y = torch.where(kp, torch.softmax(s, dim=-1), torch.zeros((), dtype=xt.dtype))
        result = {"y": y.detach().double().numpy()}
        if d_y is not None:
            y.backward(self._t(d_y))
            result["dx"] = xt.grad.double().numpy()
        return result
