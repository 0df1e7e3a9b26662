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
from dataclasses import replace
from typing import Any

import numpy as np

from ..catalogue import T, join
from ..core.cases import Case, attention_cases, case_title, masked_softmax_cases, softmax_cases
from ..core.judge import Run
from ..core.report import Finding, Report, first_line
from ..core.repro import function_reproducer
from ..meet.adapt import CONVENTIONS, Call, origin_of, read_call, target_spec, unwrap
from ..meet.build import BuildError, build_callable
from .detect import behaves_causal, mask_convention, mask_layout
from .failed import find_target

__all__ = ["check_attention", "check_masked_softmax", "check_softmax"]


_FILLED = {"scale": "1/sqrt(Dk)", "module": T("header.stand-in"), "zero": "0.0",
           "false": "False", "true": "True", "axis": "-1"}


def _check(fn: Any, check: str, convention: str, causal: bool = False,
           per_query_lens: bool = False) -> Report:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if not callable(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # a layer object with forward() and no __call__ (NumPy libraries)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    spec = target_spec(fn)
    report = Report(check, spec or name, origin=origin_of(fn))
    t0 = time.perf_counter()
    # The user's code may overflow on purpose of the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            _check_quietly(fn, check, convention, causal, report, spec, name, per_query_lens)
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
    lines = t.header("") + run.setup(case).splitlines() + t.convert_lines(case.dtype)
    lines = [ln for ln in lines if ln]
    lines += t.got_lines(arrays, case.causal) + ["first = got"]
    lines += t.got_lines(arrays, case.causal)
    lines += ["print('largest difference of two identical calls:', np.abs(got - first).max())",
              f"assert np.array_equal(got, first), {str(msg)!r}"]
    diff = np.abs(outs[0] - outs[1])
    return Finding("nondeterministic", msg,
                   T("measured.differ-by", value=float(np.nanmax(diff)))
                   if outs[0].shape == outs[1].shape else T("measured.differ-in-shape"),
                   case.label(t.check != "attention"), "\n".join(lines))


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


def _check_quietly(fn: Any, check: str, convention: str, causal: bool, report: Report,
                   spec: str | None, name: str, per_query_lens: bool = False) -> None:
    load = ""
    if not callable(fn):
        report.add(Finding("call-failed", T("call.not-callable", target=report.target,
                                            type=type(fn).__name__),
                           T("measured.not-callable")))
        return
    try:
        built = build_callable(fn, spec)
    except BuildError as err:
        report.add(Finding("call-failed", T("call.class-not-built", name=name, why=err.text),
                           T("measured.not-built")))
        return
    except (Exception, SystemExit) as err:
        report.add(Finding("call-failed", T("call.class-raised", name=name,
                                            error=f"{type(err).__name__}: {first_line(err)}"),
                           T("measured.raised", name=type(err).__name__)))
        return
    if built is not None:
        report.origin = join([x for x in (report.origin, built.how) if x])
        load = "\n".join(built.load_lines + [f"fn = {built.expr}"]) if built.expr else ""
        fn = built.obj
    n_inputs = 3 if check == "attention" else 1
    call = read_call(fn, n_inputs)
    guessed = call.guessed
    how = "declared"
    conv = convention
    if convention == "auto":
        conv, how = guessed, "from the signature"
        if check == "softmax":
            conv = "none"
    if check == "masked-softmax" and conv == "none":
        raise ValueError("check_masked_softmax: fn takes no mask argument; "
                         "pass convention='valid_lens', 'masked', 'keep' or 'additive'")
    if causal and conv == "sdpa":
        raise ValueError("causal=True declares a function that masks the future itself; the "
                         "sdpa convention passes is_causal=True in its causal cases already")
    if per_query_lens and conv not in ("valid_lens", None):
        raise ValueError(f"per_query_lens=True passes d2l's valid_lens (B, Tq), but fn's mask "
                         f"argument reads as {conv!r}: pass convention='valid_lens' if it "
                         f"takes lengths")
    target, call, notes, failure = find_target(fn, check, conv, call, spec, name, causal,
                                               load)
    if target is None:
        report.add(failure)
        return
    if failure is not None:  # a warning: fn takes one sequence, not a batch
        report.add(failure)
    run = Run(target)
    mask_layout(run, conv, call)
    if conv is None:
        found = mask_convention(run)
        conv, how = (found, "from behaviour") if found else ("keep", "assumed")
        target.convention = conv
    _header(report, target, call, conv, how, check, causal, notes)
    torch_fn = target.framework.name == "torch"
    if check == "attention":
        mask = None if conv == "none" else ("lens" if conv == "valid_lens" else "mask")
        cases = attention_cases(target.heads, mask, conv == "sdpa", torch_fn, per_query_lens)
    elif check == "softmax":
        cases = softmax_cases(torch_fn)
    else:
        cases = masked_softmax_cases(conv == "valid_lens", torch_fn, per_query_lens)
    if target.mask_keys:
        cases = [replace(c, per_key=True) if c.mask in ("random", "empty") else c
                 for c in cases]
    random = _nondeterministic(run, fn, cases[0])
    if random is not None:  # every comparison below would be noise
        report.cases.append(cases[0].label(check != "attention"))
        report.add(random)
        return
    if check == "attention" and not causal and conv != "sdpa" and behaves_causal(run):
        target.causal = target.causal_found = True  # a convention: named, judged as it is
        report.causality = T("header.behaves-causal-judged")
    for case in cases:
        report.cases.append(case.label(check != "attention"))
        only_2d = (case.mask or "").startswith("lens-2d") and report.ok
        for verdict in run.judge(case):
            if verdict.code in report.codes:
                continue
            small = case.smaller()
            used, v = case, verdict
            if small != case:
                for sv in run.judge(small):
                    if sv.code == verdict.code:
                        used, v = small, sv
                        break
            message = v.message
            if only_2d and v.code in ("shape", "inaccurate"):
                # every (B,) case passed: the function reads lengths per batch row only
                message = T("call.per-query-lens", message=message)
            report.add(Finding(v.code, message, v.measured, used.label(check != "attention"),
                               function_reproducer(run, used, v)))
    if run.unmasked:  # causal by behaviour on the probe, over every key on these cases
        names = [case_title(n) for n in dict.fromkeys(run.unmasked) if n != "probe"]
        report.causality += T("header.attends-every-key", names=join(names, "list"))


def check_softmax(fn: Any, convention: str = "auto") -> Report:
    """Judge ``fn(x)``, a softmax over the last axis, against :func:`attnkit.numpy.softmax`.

    ``fn`` takes and returns NumPy arrays or PyTorch tensors (detected). Cases: several
    shapes, logits near 1e3, 1e4 and -1e4, float64, half precision; inputs compared before
    and after each call; gradients for PyTorch functions. ``convention``: ``"auto"`` or
    ``"none"`` (a softmax takes no mask; accepted so every check has one signature).
    """
    if convention not in ("auto", "none"):
        raise ValueError(f"check_softmax takes no mask: convention must be 'auto' or 'none', "
                         f"got {convention!r}")
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
