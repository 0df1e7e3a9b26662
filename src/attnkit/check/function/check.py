"""``check_softmax``, ``check_masked_softmax``, ``check_attention``: a function against the
oracle, case by case (the judging itself: :mod:`attnkit.check.core.judge`).

Before the cases run, the function is probed (:mod:`attnkit.check.function.detect`): NumPy or
PyTorch, ``(B, H, T, D)``, ``(B, T, D)`` or ``(B, T, H, D)`` inputs, an output laid out
``(B, Tq, H, Dv)``, a mask per query and key or per key ``(B, Tk)``, for a ``mask`` argument
whose name does not say its polarity which keys it ignores, and whether it masks the future
itself (then it is judged as causal).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from ..catalogue import T, UsageError, join
from ..core.behaviour import same_reading
from ..core.cases import Case, attention_cases, case_title, masked_softmax_cases, softmax_cases
from ..core.judge import Run
from ..core.report import Finding, Report, first_line
from ..core.repro import function_reproducer, quoted, said
from ..core.spine import follow
from ..meet.adapt import CONVENTIONS, Call, origin_of, read_call, target_spec, unwrap
from ..meet.build import BuildError, build_callable
from .detect import behaves_causal, mask_convention, mask_layout
from .failed import find_target

__all__ = ["FunctionCheck", "check_attention", "check_masked_softmax", "check_softmax"]


_FILLED = {"scale": "1/sqrt(Dk)", "module": T("header.stand-in"), "zero": "0.0",
           "false": "False", "true": "True", "axis": "-1"}


def _check(fn: Any, check: str, convention: str, causal: bool = False,
           per_query_lens: bool = False) -> Report:
    if convention not in CONVENTIONS:
        raise UsageError(T("fn.convention-choices", choices=list(CONVENTIONS),
                           got=repr(convention)))
    if not callable(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # a layer object with forward() and no __call__ (NumPy libraries)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    spec = target_spec(fn)
    report = Report(check, spec or name, origin=origin_of(fn))
    # compared once a case is judged: a function that cannot be called never was
    report.oracle = {"compared": False, "why": T("oracle.why-not-reached")}
    t0 = time.perf_counter()
    # The user's code may overflow on purpose of the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            follow(FunctionCheck(fn, check, convention, causal, report, spec, name,
                                 per_query_lens))
        except ValueError as err:
            if any(w in str(err) for w in ("takes no mask argument", "causal=True declares",
                                           "per_query_lens=True")):
                raise  # the convention does not fit the check: a bad argument
            report.stopped(err, T("report.running-fn"))
        except (Exception, SystemExit) as err:  # the user's function may raise anything
            report.stopped(err, T("report.running-fn"))
    report.seconds = time.perf_counter() - t0
    return report



def _nondeterministic(run: Run, fn: Any, case: Case) -> Finding | None:
    """Two identical calls, with different random seeds: do they differ?"""
    outs = []
    for seed in (1, 2):
        np.random.seed(seed)
        if run.fw.name == "torch":
            run.fw.torch.manual_seed(seed)
        a = run.arrays(case)
        result, error, _ = run.call(a, case, case.dtype)
        if error is not None:
            return None  # the cases say what goes wrong
        try:
            outs.append(run.fw.float64(unwrap(result)[0]))
        except Exception:
            return None
    if outs[0].shape == outs[1].shape and np.array_equal(outs[0], outs[1], equal_nan=True):
        return None
    train = bool(getattr(fn, "training", False)) or bool(
        getattr(getattr(fn, "__self__", None), "training", False))
    msg = T("call.nondeterministic-train" if train else "call.nondeterministic")
    t = run.t
    arrays = run.arrays(case)
    lines = t.header("") + [run.setup(case)] + t.convert_lines(case.dtype)
    lines = [ln for ln in lines if ln]
    lines += t.got_lines(arrays, case.causal) + ["first = got"]
    lines += t.got_lines(arrays, case.causal)
    lines += ["print(" + said("repro.two-calls") + ", np.abs(got - first).max())",
              "assert np.array_equal(got, first), " + quoted(msg)]
    diff = np.abs(outs[0] - outs[1])
    return Finding("nondeterministic", msg,
                   T("measured.differ-by", value=float(np.nanmax(diff)))
                   if outs[0].shape == outs[1].shape else T("measured.differ-in-shape"),
                   case.label(t.check != "attention"), join(lines, "line"))


def _header(report: Report, target: Any, call: Call, conv: str, how: str, check: str,
            causal: bool, notes: dict) -> None:
    """The report's header: framework, convention (how it was found, how the mask is passed,
    what the check filled in), layout and declared causality."""
    report.framework = target.framework.name
    report.convention = T("header.convention", name=conv, how=T(f"how.{how}"))
    if call.mask_name and conv != "none" and call.mask_keyword:
        report.convention += T("header.passed-as-keys" if target.mask_keys
                               else "header.passed-as", name=call.mask_name)
    elif target.mask_keys:
        report.convention += T("header.per-key", name=call.mask_name or T("header.the-mask"))
    if call.flags:
        report.convention += T("header.flags", names=", ".join(call.flags))
    if "default" in notes:
        report.convention += notes["default"]
    if call.fixed:
        report.convention += T("header.fixed", values=join(
            [T("header.value", name=k, value=_FILLED.get(v, v)) for k, v in call.fixed.items()],
            "list"))
    if check == "attention":
        report.layout = "(B, H, T, D)" if target.heads else "(B, T, D)"
        if target.in_layout == "bthd":
            report.layout = T("header.layout-bthd")
        elif target.out_layout == "bthd":
            report.layout += T("header.output-bthd")
        if causal:
            report.causality = T("header.declared-causal")
    if "one-sequence" in notes:
        report.layout = (report.layout + T("header.one-sequence-after") if report.layout
                         else T("header.one-sequence"))


class FunctionCheck:
    """A softmax, masked softmax or attention function along the spine
    (:mod:`attnkit.check.core.spine`): prepare (build it, read its call, find the
    convention and layout, write the header), cases, judge (each verdict on the smallest
    case that still shows it), reproduce.

    Args:
        fn: the user's function (or class, or factory).
        check: ``"softmax"``, ``"masked-softmax"`` or ``"attention"``.
        convention: a name of :data:`CONVENTIONS` (``"auto"``: from the signature).
        causal: declared causal.
        report: the report written into.
        spec: where ``fn`` can be loaded from (the reproducers import it), or None.
        name: ``fn``'s name in sentences.
        per_query_lens: d2l's ``valid_lens`` of shape ``(B, Tq)``.
    """

    def __init__(self, fn: Any, check: str, convention: str, causal: bool, report: Report,
                 spec: str | None, name: str, per_query_lens: bool = False) -> None:
        self.fn, self.check, self.convention, self.causal = fn, check, convention, causal
        self.report, self.spec, self.name = report, spec, name
        self.per_query_lens = per_query_lens
        self.load = ""  # the lines that build fn in a reproducer
        self.conv: str | None = convention
        self.target: Any = None
        self.run: Any = None

    # -- prepare: meet the user's code ------------------------------------------------------
    def _build(self) -> bool:
        """``fn`` built (a class, a factory): False when it cannot be (said in the report)."""
        report, fn, name = self.report, self.fn, self.name
        if not callable(fn):
            report.add(Finding("call-failed", T("call.not-callable", target=report.target,
                                                type=type(fn).__name__),
                               T("measured.not-callable")))
            return False
        try:
            built = build_callable(fn, self.spec)
        except BuildError as err:
            report.add(Finding("call-failed", T("call.class-not-built", name=name,
                                                why=err.text),
                               T("measured.not-built")))
            return False
        except (Exception, SystemExit) as err:
            report.add(Finding("call-failed", T("call.class-raised", name=name,
                                                error=f"{type(err).__name__}: "
                                                      f"{first_line(err)}"),
                               T("measured.raised", name=type(err).__name__)))
            return False
        if built is not None:
            report.origin = join([x for x in (report.origin, built.how) if x])
            self.load = "\n".join(built.load_lines + [f"fn = {built.expr}"]) \
                if built.expr else ""
            self.fn = built.obj
        return True

    def _convention(self, guessed: str | None) -> tuple[str | None, str]:
        """``(convention, how it was found)``; raises ValueError where it cannot fit the
        check (a bad argument, not a finding)."""
        check, conv, how = self.check, self.convention, "declared"
        if conv == "auto":
            conv, how = guessed, "from the signature"
            if check == "softmax":
                conv = "none"
        if check == "masked-softmax" and conv == "none":
            raise UsageError(T("fn.masked-no-mask"))
        if self.causal and conv == "sdpa":
            raise UsageError(T("fn.causal-sdpa"))
        if self.per_query_lens and conv not in ("valid_lens", None):
            raise UsageError(T("fn.per-query-lens", conv=repr(conv)))
        return conv, how

    def prepare(self) -> bool:
        if not self._build():
            return False
        call = read_call(self.fn, 3 if self.check == "attention" else 1)
        conv, how = self._convention(call.guessed)
        target, call, notes, failure = find_target(self.fn, self.check, conv, call, self.spec,
                                                   self.name, self.causal, self.load)
        if target is None:
            self.report.add(failure)
            return False
        if failure is not None:  # a warning: fn takes one sequence, not a batch
            self.report.add(failure)
        run = Run(target)
        mask_layout(run, conv, call)
        if conv is None:
            found = mask_convention(run)
            conv, how = (found, "from behaviour") if found else ("keep", "assumed")
            target.convention = conv
        _header(self.report, target, call, conv, how, self.check, self.causal, notes)
        self.conv, self.target, self.run = conv, target, run
        return True

    # -- cases --------------------------------------------------------------------------------
    def cases(self) -> list[Case]:
        """The cases of the check, for this target; [] when two identical calls differ
        (every comparison would be noise). A function that masks the future by itself is
        judged as causal (a convention, named in the header)."""
        check, conv, target, run = self.check, self.conv, self.target, self.run
        torch_fn = target.framework.name == "torch"
        if check == "attention":
            mask = None if conv == "none" else ("lens" if conv == "valid_lens" else "mask")
            cases = attention_cases(target.heads, mask, conv == "sdpa", torch_fn,
                                    self.per_query_lens)
        elif check == "softmax":
            cases = softmax_cases(torch_fn)
        else:
            cases = masked_softmax_cases(conv == "valid_lens", torch_fn, self.per_query_lens)
        if target.mask_keys:
            cases = [replace(c, per_key=True) if c.mask in ("random", "empty") else c
                     for c in cases]
        random = _nondeterministic(run, self.fn, cases[0])
        if random is not None:
            self.report.cases.append(cases[0].label(check != "attention"))
            self.report.add(random)
            self.run = None  # nothing was judged: finish() has nothing to add
            return []
        if check == "attention" and not self.causal and conv != "sdpa" and behaves_causal(run):
            target.causal = target.causal_found = True  # a convention: named, judged as it is
            self.report.causality = T("header.behaves-causal-judged")
        return cases

    # -- judge and reproduce --------------------------------------------------------------------
    def judge(self, case: Case) -> Iterator[Finding]:
        report, run, plain = self.report, self.run, self.check != "attention"
        report.cases.append(case.label(plain))
        only_2d = (case.mask or "").startswith("lens-2d") and report.ok
        for verdict in run.judge(case):
            if verdict.code in report.codes:
                continue
            used, v = case, verdict
            small = case.smaller()
            if small != case:  # the smallest case that still shows it
                for sv in run.judge(small):
                    if sv.code == verdict.code and same_reading(sv.message, verdict.message):
                        used, v = small, sv
                        break
            message = v.message
            if only_2d and v.code in ("shape", "inaccurate"):
                # every (B,) case passed: the function reads lengths per batch row only
                message = T("call.per-query-lens", message=message)
            yield Finding(v.code, message, v.measured, used.label(plain),
                          self.reproduce(used, v))
        report.oracle = {"compared": True, "why": ""}

    def reproduce(self, case: Case, verdict: Any) -> str:
        return function_reproducer(self.run, case, verdict)

    def finish(self) -> None:
        # causal by behaviour on the probe, over every key on these cases
        if self.run is not None and self.run.unmasked:
            names = [case_title(n) for n in dict.fromkeys(self.run.unmasked) if n != "probe"]
            self.report.causality += T("header.attends-every-key", names=join(names, "list"))


def check_softmax(fn: Any, convention: str = "auto") -> Report:
    """Judge ``fn(x)``, a softmax over the last axis, against :func:`attnkit.numpy.softmax`.

    ``fn`` takes and returns NumPy arrays or PyTorch tensors (detected). Cases: several
    shapes, logits near 1e3, 1e4 and -1e4, float64, half precision; inputs compared before
    and after each call; gradients for PyTorch functions. ``convention``: ``"auto"`` or
    ``"none"`` (a softmax takes no mask; accepted so every check has one signature).
    """
    if convention not in ("auto", "none"):
        raise UsageError(T("fn.softmax-no-mask", got=repr(convention)))
    return _check(fn, "softmax", "auto")


def check_masked_softmax(fn: Any, convention: str = "auto",
                         per_query_lens: bool = False) -> Report:
    """Judge ``fn(x, valid_lens)`` (d2l) or ``fn(x, mask)`` against
    :func:`attnkit.numpy.masked_softmax`, ``x`` being ``(B, Tq, Tk)``.

    Args:
        fn: a NumPy or PyTorch function.
        convention: ``"auto"`` (from the argument's name; a mask's polarity from
            behaviour), ``"valid_lens"``, ``"masked"`` (True = masked), ``"keep"``
            (True = may attend) or ``"additive"`` (0 or ``finfo.min``, added).
        per_query_lens: also pass d2l's per-query lengths ``valid_lens (B, Tq)`` (query
            ``i`` of batch row ``b`` sees keys ``j < valid_lens[b, i]``), besides ``(B,)``;
            a function that reads only ``(B,)`` gets ``shape`` (it raises) or
            ``inaccurate``, with a message that says so. Needs the ``valid_lens``
            convention.
    """
    return _check(fn, "masked-softmax", convention, per_query_lens=per_query_lens)


def check_attention(fn: Any, convention: str = "auto", causal: bool = False,
                    per_query_lens: bool = False) -> Report:
    """Judge a scaled dot-product attention ``fn(q, k, v[, mask])`` against the float64
    oracle (:func:`attnkit.testing.reference_attention`).

    Args:
        fn: a NumPy or PyTorch function (or an ``nn.Module`` without parameters), taking
            ``(B, H, T, D)``, ``(B, T, D)`` or ``(B, T, H, D)`` inputs (detected), returning
            ``out`` or ``(out, weights)``; its mask may have a flag per query and key or
            one per key, ``(B, Tk)`` (a key padding mask; detected).
        convention: ``"auto"``, ``"valid_lens"``, ``"masked"``, ``"keep"``, ``"sdpa"``,
            ``"additive"`` (a float mask added to the scores: 0 or ``finfo.min``) or
            ``"none"`` (see :mod:`attnkit.check.meet.adapt`).
        causal: ``fn`` masks the future itself (query ``i`` sees keys
            ``j <= i + Tk - Tq``): it is judged against causal attention, and one that lets
            a query see later keys gets ``causal-leak``. Undeclared, a function whose
            earlier outputs do not change with later keys is judged as causal too, and
            ``report.causality`` says so.
        per_query_lens: with the ``valid_lens`` convention, also pass d2l's per-query
            lengths ``(B, Tq)`` (see :func:`check_masked_softmax`).

    Returns:
        A :class:`Report`; ``report.ok`` is False when any finding is an error.
    """
    return _check(fn, "attention", convention, causal, per_query_lens)
