"""Judging one attention call of a model (the part of ``check_model`` that looks at a
call): the output against the float64 oracle on what the call received, the received mask
against the expected one, what rows with no allowed key hold, and the explanation of an
error (the mask read the other way round, top-left causal, an ignored sliding window,
another scale). Mixed into the check by :mod:`attnkit.check.model.check`."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...testing import max_mean_error, reference_attention
from ..catalogue import T, Text
from ..core.oracle import Baseline, bound_of, rule_error
from ..core.readings import (
    first_fit,
    mask_chain,
    named_scales,
    polarity_reading,
    top_left_reading,
)
from .half import half_cause
from .masks import CallPlace, expected_keep, mask_difference, received_keep
from .report import LayerRow
from .session import first_line

__all__ = ["CallJudge"]


class CallJudge:
    """Judging methods of the check (``self`` also has ``torch``, ``names``, ``sample``,
    ``place``, ``compare`` and ``find``)."""

    def judge(self, s: Any, module: Any, index: int, snap: list, mask: Any, kwargs: dict,
              result: Any, mutated: list[str], fn: Any) -> None:
        torch = self.torch
        q, k, v = snap
        B, H, Tq, Dk = q.shape
        Tk, Dv = k.shape[-2], v.shape[-1]
        name = self.names.get(id(module), type(module).__name__)
        row = s.rows.get(name)
        if row is None:
            row = s.rows[name] = LayerRow(name)
            s.result.layers.append(row)
        row.calls += 1
        where = {"step": s.step, "layer": name}
        if mutated:
            self.find(s, row, "mutates-input", T("model.mutates", names=", ".join(mutated)),
                      "", where)
        out = result[0] if isinstance(result, (tuple, list)) else result
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, Tq, H, Dv):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            self.find(s, row, "shape", T("model.shape-transposed" if shape == (B, H, Tq, Dv)
                                         else "model.shape", shape=shape, want=(B, Tq, H, Dv)),
                      "", where)
            return
        keep, bias, words = received_keep(mask, module, kwargs, q, k, s.sdpa_masks)
        if words not in s.result.masks:
            s.result.masks.append(words)
        keep4 = keep.expand(B, H, Tq, Tk)
        place = self.place(module, name, B, Tq, Tk)
        want = expected_keep(place)
        got = out.detach().transpose(1, 2).double().cpu()  # (B, H, Tq, Dv)
        self.compare(s, row, index, out, place)
        diff = mask_difference(keep, want, place)
        if diff is not None:
            fields = {k: diff[k] for k in ("query", "q_pos", "batch", "key", "k_pos", "why")}
            text = T("model.mask-lets" if diff["allowed"] else "model.mask-hides", **fields)
            if not row.first_failure:
                row.first_failure = T("model.failure-key", step=s.step, batch=diff["batch"],
                                      query=diff["query"], key=diff["key"])
            self.find(s, row, "mask-mismatch", text,
                      T("measured.pairs-differ", n=diff["count"]), where,
                      batch=diff["batch"], head=diff["head"], query=diff["query"],
                      key=diff["key"], call=(snap, mask, kwargs, keep4, want, place, fn, module))
        self.judge_output(s, row, module, snap, mask, kwargs, keep4, bias, got, place, want,
                          fn, where)

    def judge_output(self, s: Any, row: LayerRow, module: Any, snap: list, mask: Any,
                     kwargs: dict, keep4: Any, bias: Any, got: Any, place: CallPlace,
                     want: Any, fn: Any, where: dict) -> None:
        """The output ``got`` ``(B, H, Tq, Dv)`` against the oracle on the recorded inputs
        (``snap``, ``keep4``, ``bias``): the row's worst error, and a finding that names the
        reading that explains an error beyond the rule (else ``inaccurate``)."""
        q, k, v = (t.cpu() for t in snap)  # judged on the CPU, in float64
        B, H, Tq, _ = q.shape
        nonempty = keep4.any(-1)  # (B, H, Tq)
        self.empty_rows(row, keep4, nonempty, got, v, H, s.step)
        hsel, qsel = _selection(self.torch, H, Tq, self.sample)
        judged = nonempty[:, hsel][:, :, qsel].numpy()
        dropout = float(kwargs.get("dropout", 0.0) or 0.0)
        if not judged.any() or (dropout > 0 and getattr(module, "training", False)):
            return  # nothing to judge, or random by design (check_model runs in eval mode)
        sm = _Sample.of(q, k, v, kwargs, keep4, bias, got, hsel, qsel)
        failure, ref, bound = self.against_rule(sm, row, judged, module, snap, mask, kwargs)
        if failure is None:
            return
        bi, hi, ii = _first_failing(sm.g, ref, judged, bound)
        at = dict(batch=bi, head=int(hsel[hi]), query=int(qsel[ii]))
        if not row.first_failure:
            row.first_failure = T("model.failure-head", step=s.step, batch=bi,
                                  head=at["head"], query=at["query"])
        code, message = self.reading(sm, judged, ref, (bi, hi, ii), mask, place, want, fn,
                                     module, snap, kwargs)
        self.find(s, row, code, message, failure, where,
                  call=(snap, mask, kwargs, keep4, want, place, fn, module), **at)

    def against_rule(self, sm: _Sample, row: LayerRow, judged: np.ndarray, module: Any,
                     snap: list, mask: Any, kwargs: dict) -> tuple[Any, np.ndarray, float]:
        """``(failure or None, the oracle's output, the rule's bound)`` of the judged rows;
        the baseline is plain math in the call's dtype, or the model's own eager math
        where that is further from the oracle. The row's worst error is updated."""
        g = sm.g
        ref, base = sm.oracle(sm.pick(sm.keep4).numpy(), sm.scale)
        failure = rule_error(g[judged], ref[judged], base[judged], 2.0, "output")
        if failure is not None:  # the model's own eager math on these inputs, same dtype
            own = self.own_eager(module, snap, mask, sm.keep4, kwargs)
            if own is not None:
                own = sm.pick(own).numpy()
                if np.isfinite(own[judged]).all() and \
                        bound_of(ref[judged], own[judged], 2.0) > \
                        bound_of(ref[judged], base[judged], 2.0):
                    base = own
                    failure = rule_error(g[judged], ref[judged], base[judged], 2.0, "output")
        err, bound = _error_and_bound(g[judged], ref[judged], base[judged])
        if failure is not None and _within_one_ulp(g[judged], ref[judged], sm.dtype, bound):
            failure = None  # as exact as the dtype stores it: the rule's edge, not a bug
        if row.bound == 0.0 or err / bound > row._ratio:
            row.worst_error, row.bound, row._ratio = err, bound, err / bound
        return failure, ref, bound

    def reading(self, sm: _Sample, judged: np.ndarray, ref: np.ndarray,
                first: tuple[int, int, int], mask: Any, place: CallPlace, want: Any,
                fn: Any, module: Any, snap: list, kwargs: dict) -> tuple[str, Text]:
        """``(code, message)`` of an output beyond the rule: the first reading of the
        call that fits it (non-finite values, top-left causal, the mask the other way
        round, a causal leak, padding ignored, the window ignored, another scale), else
        ``inaccurate``. ``first``: the first failing ``(b, h, i)`` of the sample."""
        torch, keep4, g = self.torch, sm.keep4, sm.g
        k, v = sm.k, sm.v
        bi, hi, ii = first
        if not np.isfinite(g[judged]).all() and np.isfinite(ref[judged]).all():
            message = T("model.non-finite")
            kv = sm.kv[hi]
            masked_bad = ~sm.pick(keep4)[bi, hi, ii] & ~torch.isfinite(
                torch.cat([k[bi, kv], v[bi, kv]], -1)).all(-1)
            if bool(masked_bad.any()):
                message = T("model.non-finite-kv", n=int(masked_bad.sum()))
            if sm.dtype in ("float16", "bfloat16") and self.twin_finite(fn, module, snap,
                                                                        mask, kwargs):
                return "float16-overflow", T(
                    "model.half-non-finite", dtype=sm.dtype,
                    cause=half_cause(sm.dtype, "NaN/inf in the output", fn, module))
            return "nan-or-inf", message
        found = first_fit(_readings(place, keep4, want, mask, torch)
                          + named_scales(sm.q.shape[-1], v.shape[-1], sm.scale), sm.fits)
        if found is not None:
            return found.code, found.words
        return "inaccurate", T("model.beyond-rule", dtype=sm.dtype)

    def empty_rows(self, row: LayerRow, keep4: Any, nonempty: Any, got: Any, v: Any,
                   H: int, step: int = 0) -> None:
        empty = ~nonempty
        if not bool(empty.any()):
            return
        row.empty_rows += int(empty.any(1).sum())
        G = H // v.shape[1]
        mean = v.double().mean(-2, keepdim=True).repeat_interleave(G, 1)  # (B, H, 1, Dv)
        vals = got[empty]
        means = mean.expand_as(got)[empty]
        scale = max(1.0, float(got[~empty.unsqueeze(-1).expand_as(got)].abs().max())
                    if bool(nonempty.any()) else 1.0)
        holds = []
        if bool(vals.isnan().any()):
            holds.append("NaN")
            if row._nan_step is None:
                row._nan_step = step
        finite = vals[vals.isfinite().all(-1)]
        fmeans = means[vals.isfinite().all(-1)]
        if finite.numel():
            zero = finite.abs().max(-1).values <= 1e-6 * scale
            uniform = (finite - fmeans).abs().max(-1).values <= 1e-2 * scale
            if bool(zero.any()):
                holds.append("0")
            if bool((uniform & ~zero).any()):
                holds.append("uniform")
            if bool((~uniform & ~zero).any()):
                holds.append("other")
        for h in holds:
            if h not in row.empty_hold:
                row.empty_hold.append(h)

    def own_eager(self, module: Any, snap: list, mask: Any, keep4: Any,
                  kwargs: dict) -> Any:
        """The model's own ``eager_attention_forward`` on the recorded q, k, v and mask, in
        their dtype: ``(B, H, Tq, Dv)`` float64 on the CPU, or None (no such function,
        or it raises). An implementation as close to the oracle as the model's own
        plain math in the same precision is never called inaccurate."""
        torch = self.torch
        fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward",
                     None)
        q = snap[0]
        if fn is None or q.dtype == torch.float64:
            return None
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            m = mask
        else:  # what eager takes: 0 where allowed, the dtype's minimum elsewhere
            m = torch.zeros(keep4.shape, dtype=q.dtype).masked_fill(
                ~keep4, torch.finfo(q.dtype).min).to(q.device)
        kw = {n: x for n, x in kwargs.items() if n not in ("dropout", "is_causal")}
        try:
            out = fn(module, *snap, m, dropout=0.0, **kw)
        except Exception:  # another signature: the textbook baseline alone
            return None
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.detach().transpose(1, 2).double().cpu()

    def twin_finite(self, fn: Any, module: Any, snap: list, mask: Any, kwargs: dict) -> bool:
        """The same call in float32: no exception, finite output."""
        torch = self.torch
        q, k, v = (t.float() for t in snap)
        m = mask.float() if isinstance(mask, torch.Tensor) and mask.is_floating_point() \
            else mask
        kw = {n: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
              for n, x in kwargs.items()}
        try:
            out = fn(module, q, k, v, m, **kw)
        except Exception:
            return False
        out = out[0] if isinstance(out, (tuple, list)) else out
        return bool(torch.isfinite(out).all())

    def raised(self, s: Any, module: Any, snap: list, mask: Any, kwargs: dict, fn: Any,
               err: Exception) -> None:
        name = self.names.get(id(module), type(module).__name__)
        dtype = str(snap[0].dtype).replace("torch.", "")
        where = {"step": s.step, "layer": name}
        row = s.rows.get(name)
        if row is None:
            row = s.rows[name] = LayerRow(name)
            s.result.layers.append(row)
        row.calls += 1
        row.first_failure = row.first_failure or T("model.failure-raised", step=s.step)
        if dtype in ("float16", "bfloat16") and self.twin_finite(fn, module, snap, mask,
                                                                 kwargs):
            error = f"{type(err).__name__}: {first_line(err)}"
            self.find(s, row, "float16-overflow", T(
                "model.half-raises", dtype=dtype, error=error,
                cause=half_cause(dtype, error, fn, module)),
                T("measured.raised", name=type(err).__name__), where,
                call=(snap, mask, kwargs, None, None, None, fn, module))
            return
        self.find(s, row, "call-failed", T(
            "model.raised", error=type(err).__name__, step=s.step, layer=name,
            line=first_line(err), q=tuple(snap[0].shape), k=tuple(snap[1].shape), dtype=dtype),
            T("measured.raised", name=type(err).__name__), where,
            call=(snap, mask, kwargs, None, None, None, fn, module))

    # -- across implementations ---------------------------------------------------------------


def _error_and_bound(got: np.ndarray, ref: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(got)
    err = max_mean_error(got[ok], ref[ok])[0] if ok.all() else math.inf
    return err, bound_of(ref, base, 2.0)


_PRECISION = {"bfloat16": (8, -133), "float16": (11, -24)}  # significand bits, subnormal


def _within_one_ulp(got: np.ndarray, ref: np.ndarray, dtype: str, bound: float) -> bool:
    """Half precision: is every element within the rule's ``bound`` or within one unit in
    the last place of the oracle's value in ``dtype`` (the most a faithfully rounded result
    can be off: a baseline that happens to round better must not make it a finding)?"""
    if dtype not in _PRECISION or not np.isfinite(got).all():
        return False
    bits, tiniest = _PRECISION[dtype]
    _, exp = np.frexp(ref)
    ulp = np.maximum(np.ldexp(1.0, exp - bits), np.ldexp(1.0, tiniest))
    return bool((np.abs(got - ref) <= np.maximum(bound, ulp)).all())


def _readings(place: CallPlace, keep4: Any, want: Any, mask: Any, torch: Any) -> list:
    """The mask readings of a call (:func:`~..core.readings.mask_chain`), their parts from
    what the model's config and padding call for (``place``), not read from the mask."""
    Tq, Tk = keep4.shape[-2:]
    later = (place.k_index[None, :] > place.q_index[:, None]) & \
        (place.k_index < max(place.n_tokens, 1))[None, :]  # (Tq, Tk), no empty slot
    real = place.key_real.clone()
    if place.n_tokens:
        real |= (place.k_index < place.n_tokens)[None, :]
    padded = expected_keep(_with_real_keys(place, real))[:, None] \
        & ~place.key_real[:, None, None, :]
    outside = None
    if place.window is not None:
        outside = (expected_keep(place, window=False) & ~want)[:, None]
    return mask_chain(keep4, top_left=top_left_reading(Tq, Tk, keep4, torch),
                      polarity=None if mask is None else polarity_reading(keep4),
                      later=later if place.causal else None, padded=padded,
                      outside=outside, window=place.window)


def _with_real_keys(place: CallPlace, real: Any) -> CallPlace:
    """``place`` with ``real`` as its ``key_real`` (every token of the sequence real)."""
    from dataclasses import replace

    return replace(place, key_real=real)


def _first(bad: np.ndarray) -> tuple[int, int, int]:
    """``(b, h, i)`` of the first True of ``(B, H, Tq)`` in query order."""
    idx = np.argwhere(bad)
    j = np.lexsort((idx[:, 1], idx[:, 0], idx[:, 2]))[0]
    return int(idx[j, 0]), int(idx[j, 1]), int(idx[j, 2])


def _selection(torch: Any, H: int, Tq: int, sample: int | None) -> tuple[Any, Any]:
    """``(heads, queries)`` judged against the oracle: all, or with ``--sample`` at most
    ``sample`` of each, evenly spaced (key/value heads follow their queries)."""
    qsel, hsel = torch.arange(Tq), torch.arange(H)
    if sample and Tq > sample:
        qsel = torch.linspace(0, Tq - 1, sample).round().long().unique()
    if sample and H > sample:
        hsel = torch.linspace(0, H - 1, sample).round().long().unique()
    return hsel, qsel


@dataclass
class _Sample:
    """The judged heads and queries of one call in float64 NumPy, ``(B, heads, queries,
    ...)``: the output got, what the oracle needs, and the oracle on another mask."""

    q: Any  # the recorded tensors, on the CPU, (B, H, T, D)
    k: Any
    v: Any
    keep4: Any  # (B, H, Tq, Tk) the keys the call lets each query see
    hsel: Any
    qsel: Any
    kv: Any  # the key/value head of each query head kept
    g: np.ndarray  # the output got
    q64: np.ndarray
    k64: np.ndarray
    v64: np.ndarray
    bias: np.ndarray | None
    scale: float
    softcap: Any
    sinks: np.ndarray | None
    dtype: str

    @classmethod
    def of(cls, q: Any, k: Any, v: Any, kwargs: dict, keep4: Any, bias: Any, got: Any,
           hsel: Any, qsel: Any) -> _Sample:
        B, H, Tq, _ = q.shape
        scale = kwargs.get("scaling")
        scale = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
        sinks = kwargs.get("s_aux")
        sinks = None if sinks is None else sinks.detach().double().cpu()[hsel].numpy()

        def pick(t: Any) -> Any:
            return t[:, hsel][:, :, qsel]

        bias_sel = None
        if bias is not None:
            bias_sel = pick(bias.double().cpu().expand(B, H, Tq, k.shape[-2])).numpy()
        kv = hsel // (H // k.shape[1])
        return cls(q, k, v, keep4, hsel, qsel, kv, pick(got).numpy(), pick(q.double()).numpy(),
                   k.double()[:, kv].numpy(), v.double()[:, kv].numpy(), bias_sel, scale,
                   kwargs.get("softcap"), sinks, str(q.dtype).replace("torch.", ""))

    def pick(self, t: Any) -> Any:
        """``(B, H, Tq, ...)`` -> ``(B, heads, queries, ...)``."""
        return t[:, self.hsel][:, :, self.qsel]

    def oracle(self, keep_sel: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """``(float64 oracle, plain math in the call's dtype)`` with the keys ``keep_sel``."""
        ref = reference_attention(self.q64, self.k64, self.v64, mask=keep_sel, bias=self.bias,
                                  scale=scale, softcap=self.softcap, sinks=self.sinks).out
        base = Baseline("torch", self.dtype).attention(
            self.q64, self.k64, self.v64, keep_sel, scale, bias=self.bias,
            softcap=self.softcap, sinks=self.sinks)["out"]
        return ref, base

    def fits(self, alt: Any, scale: float | None = None) -> bool:
        """Does the output agree with the oracle by the rule under the keys ``alt``
        ``(B, H, Tq, Tk)`` (None: the call's own) and ``scale`` (None: the call's)?"""
        alt_sel = self.pick(self.keep4 if alt is None else alt).numpy()
        scale = self.scale if scale is None else scale
        rows = alt_sel.any(-1)
        if not rows.any():
            return False
        r2, b2 = self.oracle(alt_sel, scale)
        ok = rows & np.isfinite(b2).all(-1)
        return bool(ok.any()) and rule_error(self.g[ok], r2[ok], b2[ok], 2.0, "alt") is None


def _first_failing(g: np.ndarray, ref: np.ndarray, judged: np.ndarray,
                   bound: float) -> tuple[int, int, int]:
    """``(b, h, i)`` of the first judged row beyond ``bound`` (else the first non-finite
    one, else the first judged one: finite where the oracle is NaN)."""
    per_row = np.abs(g - ref).max(-1)
    per_row = np.where(np.isfinite(per_row), per_row, np.inf)
    bad = judged & (per_row > bound)
    if not bad.any():
        bad = judged & ~np.isfinite(g).all(-1)
    if not bad.any():
        bad = judged
    return _first(bad)
