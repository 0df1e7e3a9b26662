"""The engine of the function checks: :class:`Run` judges one function case by case.

Each case gives at most one finding, the most specific one: an exception or a wrong
shape (``shape``), then non-finite values (``nan-or-inf``, or ``float16-overflow`` when the
same inputs in float32 are fine), then the error rule. An error beyond the rule is
explained when another reading of the function fits within it (top-left causal:
``causal-alignment``; another scale: ``wrong-scale``; the mask read the other way round:
``mask-polarity``; a row with no allowed key that is not 0 while the others pass:
``fully-masked-row``), else it is ``inaccurate``. Gradients are compared only where the
output passes, so one bug gives one code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..meet.calls import Target
from .behaviour import (
    explain_attention,
    explain_masked_softmax,
    explain_weights,
    times_row_max,
    unread_keys,
)
from .cases import Case, attention_setup, run_setup, softmax_setup
from .oracle import Baseline, bound_of, keep_of, oracle_attention, oracle_softmax, rule_error
from .overflow import fill_words, overflow_cause
from .readings import first_fit, polarity_reading, scale_readings, top_left_reading
from .report import T, Text, first_line

__all__ = ["Run", "Verdict", "first_line"]


class Verdict:
    """What one case found: a code, its message, the measured error, reproducer details."""

    def __init__(self, code: str, message: Text, measured: Text | str = "",
                 **detail: Any) -> None:
        self.code, self.message, self.measured, self.detail = code, message, measured, detail


class Run:
    """One check of one function: the cases, each judged against the oracle."""

    def __init__(self, target: Target) -> None:
        self.t = target
        self.fw = target.framework
        self.unmasked: list[str] = []  # cases a causal_found target attends every key on

    # -- inputs and the oracle ------------------------------------------------------------
    def setup(self, case: Case) -> str:
        return attention_setup(case) if self.t.check == "attention" else softmax_setup(case)

    def arrays(self, case: Case) -> dict[str, np.ndarray]:
        raw = run_setup(self.setup(case))
        return {k: (self.fw.rounded(a, case.dtype) if k in self.t.inputs else a)
                for k, a in raw.items()}

    def keep(self, a: dict[str, np.ndarray], causal: bool | None = None) -> np.ndarray | None:
        """The case's keep-mask, full shape ``(..., Tq, Tk)``; None for a plain softmax.
        A function declared causal (``causal``, default: the target's) also keeps only keys
        ``j <= i + Tk - Tq`` (bottom-right, as attnkit)."""
        if self.t.check == "softmax":
            return None
        x = a["q"] if "q" in a else a["x"]
        Tq = x.shape[-2]
        Tk = a["k"].shape[-2] if "k" in a else x.shape[-1]
        keep = keep_of(a, x.shape[:-2], Tq, Tk)
        if self.t.causal if causal is None else causal:
            keep = keep & np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)
        return keep

    def want(self, a: dict, keep: np.ndarray | None, scale: float | None = None,
             grads: bool = False) -> dict:
        if self.t.check == "attention":
            r = oracle_attention(a["q"], a["k"], a["v"], keep, scale,
                                 a.get("d_out") if grads else None)
            return {"out": r.out, "weights": r.weights, "dq": r.dq, "dk": r.dk, "dv": r.dv}
        y, dx = oracle_softmax(a["x"], keep, a.get("d_y") if grads else None)
        return {"out": y, "dx": dx}

    def base(self, a: dict, keep: np.ndarray | None, dtype: str, scale: float | None = None,
             grads: bool = False) -> dict:
        b = Baseline(self.fw.name, dtype)
        if self.t.check == "attention":
            return b.attention(a["q"], a["k"], a["v"], keep, scale,
                               a.get("d_out") if grads else None)
        r = b.softmax(a["x"], keep, a.get("d_y") if grads else None)
        return {"out": r["y"], "dx": r.get("dx")}

    # -- calling --------------------------------------------------------------------------
    def call(self, a: dict, case: Case, dtype: str, grad: bool = False) -> tuple[Any, Any, list]:
        """``(result or None, exception or None, [(name, before, after)])``."""
        inputs, extra, kw = self.t.parts(a, dtype, case.causal, grad)
        given = list(zip(self.t.inputs, inputs)) + [("mask", x) for x in extra] + [
            (k, x) for k, x in kw.items() if hasattr(x, "shape")]
        before = [self.fw.snapshot(x) for _, x in given]
        try:
            result = self.t.invoke(inputs, extra, kw)
            error = None
        except Exception as err:  # the user's code may raise anything
            result, error = None, err
        return result, error, [(n, b, x) for (n, x), b in zip(given, before)]

    def twin_finite(self, a: dict, case: Case) -> bool:
        """The same inputs in float32: no exception, finite where the oracle is."""
        result, error, _ = self.call(a, case, "float32")
        if error is not None:
            return False
        try:
            out = self.fw.float64(self.t.output(result)[0])
        except Exception:
            return False
        return bool(np.isfinite(out).all())

    # -- judging one case -----------------------------------------------------------------
    def judge(self, case: Case) -> list[Verdict]:
        a = self.arrays(case)
        keep = self.keep(a)
        want = self.want(a, keep, grads=case.grads)
        result, error, seen = self.call(a, case, case.dtype)
        verdicts = []
        for name, before, after in seen:
            if not self.fw.same(before, after):
                verdicts.append(Verdict(
                    "mutates-input", T("judge.mutates", name=name),
                    T("measured.differs-after", name=name), name=name))
                break
        if error is not None:
            if case.half and self.twin_finite(a, case):
                problem = f"{type(error).__name__}: {first_line(error)}"
                verdicts.append(Verdict(
                    "float16-overflow", T("judge.half-raises", dtype=case.dtype, error=problem,
                                          cause=overflow_cause(self.t.fn, case.dtype, problem)),
                    T("measured.raised", name=problem), raises=True))
            elif not case.half:
                verdicts.append(Verdict(
                    "shape", T("judge.raises-on", case=case.label(self.t.check != "attention"),
                               error=f"{type(error).__name__}: {first_line(error)}"),
                    T("measured.raised", name=type(error).__name__), raises=True))
            return verdicts
        try:
            out, weights = self.t.output(result)
            got = self.fw.float64(out)
        except Exception as err:
            return verdicts + [Verdict("shape", T("judge.not-an-array",
                                                  type=type(result).__name__,
                                                  error=first_line(err)))]
        if self.t.causal_found and got.shape == want["out"].shape and case.sizes[2] > 1:
            free = self.keep(a, causal=False)
            if not self.fits(a, keep, None, case, got) and self.fits(a, free, None, case, got):
                keep, want = free, self.want(a, free, grads=case.grads)  # not causal here
                self.unmasked.append(case.name)
        verdict = self.judge_output(case, a, keep, want, got, weights)
        if verdict is not None:
            return verdicts + [verdict]
        if case.grads and self.fw.name == "torch" and not verdicts:
            verdict = self.judge_grads(case, a, keep, want)
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts

    def judge_output(self, case: Case, a: dict, keep: Any, want: dict, got: np.ndarray,
                     weights: Any) -> Verdict | None:
        ref = want["out"]
        if got.shape != ref.shape:
            return Verdict("shape", T("judge.output-shape", shape=got.shape, want=ref.shape,
                                      case=case.label(self.t.check != "attention")),
                            T("measured.shape", shape=got.shape, want=ref.shape))
        empty = (np.zeros(ref.shape[:-1], dtype=bool) if keep is None
                 else ~np.broadcast_to(keep, ref.shape[:-1] + keep.shape[-1:]).any(-1))
        if self.t.check != "attention":  # a softmax: rows of weights, one per query
            empty = np.broadcast_to(empty[..., None], ref.shape)
        rows = ~empty
        bad = ~np.isfinite(got)
        if bad.any():
            only_empty = bool(empty.any() and bad[empty].any() and not bad[rows].any())
            count = T("measured.non-finite-empty" if only_empty else "measured.non-finite",
                      n=int(bad.sum()), size=bad.size)
            if case.half and self.twin_finite(a, case):
                return Verdict("float16-overflow", T(
                    "judge.half-non-finite", dtype=case.dtype,
                    cause=overflow_cause(self.t.fn, case.dtype, "NaN/inf in the output")),
                    count, finite=True)
            if not only_empty and case.spread:
                msg = T("judge.one-maximum")
            elif not only_empty and self.lse_without_max(a, case):
                msg = T("judge.lse-max-not-added")
            elif not only_empty and case.logit and self.t.check == "attention":
                msg = T("judge.no-max-trick-attention")
            elif not only_empty:
                msg = T("judge.no-max-trick" if case.logit else "judge.non-finite")
            else:
                msg = T("judge.empty-row-nan")
            return Verdict("nan-or-inf", msg, count, finite=True)
        factor = 2.0
        base = self.base(a, keep, case.dtype)
        name = "output" if self.t.check == "attention" else "softmax"
        err = rule_error(got, ref, base["out"], factor, name)
        if err is None:
            if weights is not None and self.t.check == "attention":
                w = self.fw.float64(weights)
                if w.shape == want["weights"].shape:
                    err = rule_error(w, want["weights"], base["weights"], factor, "weights")
                    if err is not None:
                        unmasked = explain_weights(a, keep, w, bound_of(
                            want["weights"], base["weights"], factor))
                        return Verdict("inaccurate", unmasked or T("judge.weights"), err)
            return None
        other = self.explain(case, a, keep, got, err, ref, base["out"])
        if other is not None:
            return other
        if empty.any() and rule_error(got[rows], ref[rows], base["out"][rows], factor,
                                      name) is None:
            row_out = got[empty]
            uniform = self.uniform_rows(a, got, empty)
            what = (T("judge.row-uniform-additive") if uniform and self.t.convention == "additive"
                    else T("judge.row-uniform", fill=fill_words(self.t.fn)) if uniform
                    else T("judge.row-other"))
            return Verdict("fully-masked-row", T("judge.empty-row", what=what),
                           T("measured.empty-rows", value=float(np.abs(row_out).max())),
                           empty=True)
        bound = bound_of(ref, base["out"], factor)
        ok = np.isfinite(got) & np.isfinite(ref)
        worst = float(np.abs(got - ref)[ok].max()) if ok.any() else 0.0
        if worst > 100 * bound and worst > 1e-3 * max(float(np.abs(ref[ok]).max()), 1.0):
            # Not a rounding question: say so, or a learner hunts for lost precision.
            return Verdict("inaccurate", T("judge.wrong-not-imprecise-half" if case.half
                                           else "judge.wrong-not-imprecise", worst=worst,
                                           bound=bound, dtype=case.dtype), err, bound=bound)
        return Verdict("inaccurate", T("judge.beyond-rule-half" if case.half
                                       else "judge.beyond-rule", dtype=case.dtype),
                       err, bound=bound)

    def uniform_rows(self, a: dict, got: np.ndarray, empty: np.ndarray) -> bool:
        if self.t.check == "attention":
            mean = np.broadcast_to(a["v"].mean(-2, keepdims=True), got.shape)
        else:
            mean = np.full(got.shape, 1.0 / got.shape[-1])
        return bool(np.allclose(got[empty], mean[empty], atol=1e-2 * max(1, np.abs(mean).max())))

    def explain(self, case: Case, a: dict, keep: Any, got: np.ndarray, err: str,
                ref: np.ndarray, base: np.ndarray) -> Verdict | None:
        """An error beyond the rule: does another reading of the function fit the rule?
        (The readings every kind of check tries: :mod:`.readings`.)"""
        bound = bound_of(ref, base, 2.0)

        def fits(alt: Any, scale: float | None) -> bool:
            return self.fits(a, keep if alt is None else alt, scale, case, got)

        if self.t.check == "attention":
            Tq, Tk, Dk, Dv = a["q"].shape[-2], a["k"].shape[-2], a["q"].shape[-1], a["v"].shape[-1]
            declared = self.t.causal and not self.t.causal_found  # causal-leak needs intent
            if declared and Tq > 1 and self.fits(a, self.keep(a, causal=False), None, case,
                                                 got):
                return Verdict("causal-leak", T("judge.leak-no-mask"), err, bound=bound,
                               leak=True)
            if not self.t.causal and not case.causal and Tq > 1 and self.fits(
                    a, self.keep(a, causal=True), None, case, got):
                # A function causal throughout is found so before the cases and judged
                # as causal; this one is causal here and not on the probe of causality.
                return Verdict("inaccurate", T("judge.causal-here"), err, bound=bound)
            if case.causal or self.t.causal:
                found = first_fit([top_left_reading(Tq, Tk, self.keep(a, causal=False)
                                                    if self.t.causal else None)], fits)
                if found is not None:
                    return Verdict("causal-alignment", T("judge.top-left"), err, bound=bound,
                                   top_left=True)
            moved = self.sees_later_keys(case, a) if declared and Tq > 1 else None
            if moved is not None:
                return Verdict("causal-leak", T("judge.leak-moved", query=moved), err,
                               bound=bound, moved=moved)
            found = first_fit(scale_readings(Dk, Dv), fits)
            if found is not None:
                return Verdict("wrong-scale", T("judge.scale", scaled=found.words,
                                                default=1.0 / math.sqrt(Dk)),
                               err, bound=bound, scale=found.scale)
        elif keep is None:
            if times_row_max(a["x"], got, bound):
                return Verdict("inaccurate", T("judge.lse-max-not-added"), err, bound=bound)
            for axis in range(a["x"].ndim - 1):
                alt = np.moveaxis(oracle_softmax(np.moveaxis(a["x"], axis, -1), None)[0], -1,
                                  axis)
                if np.abs(alt - got).max() <= bound:
                    return Verdict("inaccurate", T("judge.axis", axis=axis), err, bound=bound)
        # A mask read the other way round: the case's own mask, or (no mask in the case, a
        # required mask argument) the mask that allows every key, read as "mask all".
        passed_mask = case.mask in ("random", "empty") or (
            case.mask is None and not self.t.mask_default
            and self.t.convention in ("masked", "keep"))
        if passed_mask and keep is not None and first_fit([polarity_reading(keep)], fits):
            return Verdict("mask-polarity", T("judge.polarity", convention=self.t.convention,
                                              meaning=_polarity(self.t.convention)),
                           err, bound=bound)
        said = self.behaviour(case, a, keep, got, base)
        return None if said is None else Verdict("inaccurate", said, err, bound=bound)

    def lse_without_max(self, a: dict, case: Case) -> bool:
        """A softmax that overflows: on the same rows moved to a row maximum between 0.5
        and 2 (nothing overflows there), is it the softmax times ``exp(row max)``?"""
        if self.t.check != "softmax" or case.half:
            return False
        x = a["x"].astype(np.float64)
        shift = np.linspace(0.5, 2.0, x.shape[-2])[:, None]
        probe = dict(a, x=self.fw.rounded(x - x.max(-1, keepdims=True) + shift, case.dtype))
        result, error, _ = self.call(probe, case, case.dtype)
        try:
            got = None if error is not None else self.fw.float64(self.t.output(result)[0])
        except Exception:
            return False
        want = oracle_softmax(probe["x"], None)[0]
        bound = bound_of(want, self.base(probe, None, case.dtype)["out"], 2.0)
        return got is not None and times_row_max(probe["x"], got, bound)

    def behaviour(self, case: Case, a: dict, keep: Any, got: np.ndarray,
                  base: np.ndarray) -> Text | None:
        """What an attention output beyond the rule computes instead (:mod:`.behaviour`):
        the sentence that names it, or None."""

        bound = bound_of(self.want(a, keep)["out"], base, 2.0)

        def fits_alt(alt: np.ndarray) -> bool:  # within the rule's bound of the oracle
            return bool(alt.shape == got.shape and np.isfinite(alt).all()
                        and np.isfinite(got).all() and np.abs(alt - got).max() <= bound)

        def output(arrays: dict) -> np.ndarray | None:
            result, error, _ = self.call(arrays, case, case.dtype)
            try:
                return None if error is not None else self.fw.float64(
                    self.t.output(result)[0])
            except Exception:
                return None

        def fits_keep(alt: Any) -> bool:  # None: no key masked
            return self.fits(a, np.ones_like(keep) if alt is None else alt, None, case, got)

        if self.t.check == "masked-softmax":
            said = explain_masked_softmax(a, got, fits_keep)
            lens = a.get("valid_lens")
            if getattr(said, "key", "") == "judge.mask-ignored" and lens is not None \
                    and lens.ndim == 1 and got.shape[-2] > 1:
                # Every query of this case within its length: a length of 1 tells the
                # lengths cutting the queries from no mask at all.
                one = dict(a, valid_lens=np.ones_like(lens))
                cut = output(one)
                if cut is not None and explain_masked_softmax(one, cut, lambda alt: self.fits(
                        one, alt, None, case, cut)) == T("judge.lens-on-queries"):
                    return T("judge.lens-on-queries")
            return said
        if self.t.check != "attention":
            return None
        said = explain_attention(a, keep, got, fits_alt, fits_keep)
        return said if said is not None else unread_keys(a, keep, got, output)

    def sees_later_keys(self, case: Case, a: dict) -> int | None:
        """For a function declared causal: the first query ``i`` whose output moves when
        only the keys and values after its position (``j > i + Tk - Tq``) change; None when
        none does (or the function cannot be called so)."""
        tol = 1e-3 if case.half else 1e-6  # a key it does not see moves nothing at all
        Tq, Tk = a["q"].shape[-2], a["k"].shape[-2]

        def out(arrays: dict) -> np.ndarray | None:
            result, error, _ = self.call(arrays, case, case.dtype)
            if error is not None:
                return None
            try:
                return self.fw.float64(self.t.output(result)[0])
            except Exception:
                return None

        first = out(a)
        if first is None:
            return None
        g = np.random.default_rng(11)
        for i in range(min(Tq, 16)):
            later = i + Tk - Tq + 1  # the first key query i must not see
            if later >= Tk or later < 1:
                continue
            b = dict(a)
            for name in ("k", "v"):
                x = a[name].copy()
                x[..., later:, :] += g.standard_normal(x[..., later:, :].shape)
                b[name] = self.fw.rounded(x, case.dtype)
            moved = out(b)
            if moved is None:
                return None
            row_a, row_b = first[..., i, :], moved[..., i, :]
            if np.isfinite(row_a).all() and not np.allclose(row_a, row_b, rtol=tol,
                                                             atol=tol):
                return i
        return None

    def fits(self, a: dict, keep: Any, scale: float | None, case: Case, got: np.ndarray) -> bool:
        want = self.want(a, keep, scale)["out"]
        base = self.base(a, keep, case.dtype, scale)["out"]
        finite = np.isfinite(base)
        if keep is not None:  # rows with no allowed key are fully-masked-row's business
            rows = np.broadcast_to(keep, want.shape[:-1] + keep.shape[-1:]).any(-1)
            finite = finite & rows[..., None]
        return rule_error(got[finite], want[finite], base[finite], 2.0, "alt") is None

    def judge_grads(self, case: Case, a: dict, keep: Any, want: dict) -> Verdict | None:
        torch = self.fw.torch
        cot = "d_out" if self.t.check == "attention" else "d_y"
        leaves, extra, kw = self.t.parts(a, case.dtype, case.causal, grad=True)
        # Clones, as inputs that come out of a projection: an in-place op on them is the
        # caller's business (mutates-input), not the gradient's.
        res_out = self.t.output(self.t.invoke([x.clone() for x in leaves], extra, kw))[0]
        if not isinstance(res_out, torch.Tensor) or res_out.grad_fn is None:
            return Verdict("gradient", T("judge.no-grad-fn"), T("measured.no-grad-fn"),
                           grad=None)
        try:
            res_out.backward(torch.from_numpy(a[cot]).to(res_out.dtype))
        except Exception as err:
            return Verdict("gradient", T("judge.backward-raises",
                                         error=f"{type(err).__name__}: {first_line(err)}"),
                           T("measured.raised", name=type(err).__name__), grad=None)
        base = self.base(a, keep, case.dtype, grads=True)
        names = ("q", "k", "v") if self.t.check == "attention" else ("x",)
        factors = {"q": 5.0, "k": 3.0, "v": 3.0, "x": 3.0}
        for name, t in zip(names, leaves):
            key = "d" + name
            if t.grad is None:
                return Verdict("gradient", T("judge.input-no-grad", name=name),
                               T("measured.grad-none"), grad=name)
            g = t.grad.double().numpy()
            err = rule_error(g, want[key], base[key], factors[name], key)
            if err is not None:
                return Verdict("gradient", T("judge.grad-disagrees", name=name), err,
                               grad=name, bound=bound_of(want[key], base[key], factors[name]))
        return None


def _polarity(convention: str) -> Text | str:
    if convention in ("masked", "keep", "sdpa"):
        return T(f"polarity.{convention}")
    return convention
