"""``check_softmax``, ``check_masked_softmax``, ``check_attention``: a function against the
oracle, case by case (the judging itself: :mod:`attnkit.check.judge`).

Before the cases run, the function is probed: NumPy or PyTorch (it is called with arrays,
then tensors), ``(B, H, T, D)`` or ``(B, T, D)`` inputs, and, for a ``mask`` argument whose
name does not say its polarity, which keys it ignores when given a mask.
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from typing import Any

import numpy as np

from .adapt import CONVENTIONS, Framework, mask_parameter, origin_of, target_spec, unwrap
from .build import BuildError, build_callable
from .calls import Target
from .cases import Case, attention_cases, masked_softmax_cases, softmax_cases
from .judge import Run, first_line
from .report import Finding, Report
from .repro import function_reproducer

__all__ = ["check_attention", "check_masked_softmax", "check_softmax"]


# -- detection --------------------------------------------------------------------------------
def _probe(fn: Any, check: str, convention: str | None, mask_default: bool,
           spec: str | None, name: str, load: str = "") -> tuple[Target | None, list[str]]:
    """Find the framework (and, for attention, the layout) ``fn`` runs with."""
    frameworks = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    errors = []
    for fw_name in frameworks:
        fw = Framework(fw_name)
        for heads in ((True, False) if check == "attention" else (True,)):
            t = Target(fn, check, fw, convention or "keep", heads, mask_default, spec, name, load)
            mask = None
            if check == "masked-softmax":
                mask = "lens" if convention == "valid_lens" else "random"
            sizes = (2, 3 if heads else 0, 4, 4, 8, 8) if check == "attention" \
                else (2, 0, 3, 4, 0, 0)
            case = Case("probe", sizes=sizes, mask=mask)
            run = Run(t)
            a = run.arrays(case)
            result, error, _ = run.call(a, case, "float32")
            if error is not None:
                errors.append(f"{fw_name} {'(B, H, T, D)' if heads else '(B, T, D)'}: "
                              f"{type(error).__name__}: {first_line(error)}")
                continue
            out = unwrap(result)[0]
            if not fw.is_result(out):
                errors.append(f"{fw_name}: returned {type(out).__name__}")
                continue
            want_shape = run.want(a, run.keep(a))["out"].shape
            if tuple(out.shape) == want_shape:
                return t, errors
            errors.append(f"{fw_name}: output shape {tuple(out.shape)}, expected {want_shape}")
    return None, errors


def _polarity_probe(run: Run) -> str | None:
    """``"masked"`` or ``"keep"``: given a mask that is True on the last two keys, which
    keys does ``fn`` ignore? None when neither reading holds."""
    t = run.t
    a = run.arrays(Case("probe", sizes=(2, 3 if t.heads else 0, 4, 5, 8, 8)
                        if t.check == "attention" else (2, 0, 4, 5, 0, 0)))
    x = a["q"] if "q" in a else a["x"]
    flag = np.zeros(x.shape[:-1] + (5,), dtype=bool)
    flag[..., 3:] = True
    t.convention = "keep"  # pass the flag as it is
    for polarity, ignored in (("masked", flag), ("keep", ~flag)):
        outs = []
        for bump in (0.0, 3.0):
            b = dict(a, keep=flag)
            if t.check == "attention":
                b["v"] = a["v"] + bump * ignored[..., 0, :, None]
                b["k"] = a["k"] + bump * ignored[..., 0, :, None]
            else:
                b["x"] = a["x"] + bump * ignored
            result, error, _ = run.call(b, Case("probe"), "float32")
            if error is not None:
                return None
            out = run.fw.float64(unwrap(result)[0])
            outs.append(out if t.check == "attention" else np.where(ignored, 0.0, out))
        if np.isfinite(outs[0]).all() and np.allclose(outs[0], outs[1], atol=1e-6):
            return polarity
    return None


def _check(fn: Any, check: str, convention: str) -> Report:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    spec = target_spec(fn)
    report = Report(check, spec or name, origin=origin_of(fn))
    t0 = time.perf_counter()
    # The user's code may overflow on purpose of the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            _check_quietly(fn, check, convention, report, spec, name)
        except ValueError as err:
            if "takes no mask argument" in str(err):
                raise  # the convention does not fit the check: a bad argument
            report.add(_stopped(err, report))
        except (Exception, SystemExit) as err:  # the user's function may raise anything
            report.add(_stopped(err, report))
    report.seconds = time.perf_counter() - t0
    return report


def _stopped(err: BaseException, report: Report) -> Finding:
    return Finding("call-failed", f"the check stopped while running fn: {type(err).__name__}: "
                   f"{first_line(err)}", type(err).__name__,
                   case=report.cases[-1] if report.cases else "")


def _call_failed(fn: Any, check: str, errors: list[str]) -> Finding:
    args = "fn(q, k, v[, mask])" if check == "attention" else (
        "fn(x, mask)" if check == "masked-softmax" else "fn(x)")
    if check == "attention":
        layouts = "NumPy arrays and PyTorch tensors, (B, H, T, D) and (B, T, D)"
    else:
        layouts = "NumPy arrays and PyTorch tensors"
    fix = ("the check calls it as " + args + ": take the inputs positionally (not keyword-"
           "only), declare the mask with --convention, or wrap it: "
           "def fn(q, k, v): return mine(...)")
    if callable(getattr(fn, "forward", None)):
        fix = "pass an instance, or a function that calls it; " + fix
    owner = getattr(fn, "__self__", fn)
    if type(owner).__module__.startswith("torch") or any(
            c.__module__.startswith("torch.nn") for c in type(owner).__mro__[1:]):
        errors = [e for e in errors if e.startswith("torch")] + [
            e for e in errors if not e.startswith("torch")]  # its own framework's error first
    first = errors[0] if errors else "no output"
    return Finding("call-failed", f"fn could not be called with {layouts}: {first}; {fix}",
                   f"{len(errors)} call(s) tried: " + "; ".join(errors))


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
    msg = ("two identical calls give different outputs: dropout is on: call `.eval()` or pass "
           "dropout 0" + (" (fn is a module left in train mode)" if train else
                          " (F.dropout's training argument defaults to True: pass "
                          "training=self.training)"))
    t = run.t
    arrays = run.arrays(case)
    lines = t.header("") + run.setup(case).splitlines() + t.convert_lines(case.dtype)
    lines = [ln for ln in lines if ln]
    lines += t.got_lines(arrays, case.causal) + ["first = got"]
    lines += t.got_lines(arrays, case.causal)
    lines += ["print('largest difference of two identical calls:', np.abs(got - first).max())",
              f"assert np.array_equal(got, first), {msg!r}"]
    diff = np.abs(outs[0] - outs[1])
    return Finding("nondeterministic", msg,
                   f"two identical calls differ by up to {float(np.nanmax(diff)):.3g}"
                   if outs[0].shape == outs[1].shape else "two identical calls differ in shape",
                   case.label(t.check != "attention"), "\n".join(lines))


def _check_quietly(fn: Any, check: str, convention: str, report: Report, spec: str | None,
                   name: str) -> None:
    load = ""
    if not callable(fn):
        report.add(Finding("call-failed", f"{report.target} is a {type(fn).__name__} object, "
                           f"not something to call: name a function, an instance or a class",
                           "not callable"))
        return
    try:
        built = build_callable(fn, spec)
    except BuildError as err:
        report.add(Finding("call-failed", f"{name} is a class and the check needs something "
                           f"to call: {err}", "not built"))
        return
    except (Exception, SystemExit) as err:
        report.add(Finding("call-failed", f"{name} is a class; building it raised "
                           f"{type(err).__name__}: {first_line(err)}; pass an instance or a "
                           f"function instead", type(err).__name__))
        return
    if built is not None:
        report.origin = "; ".join(x for x in (report.origin, built.how) if x)
        load = "\n".join(built.load_lines + [f"fn = {built.expr}"]) if built.expr else ""
        fn = built.obj
    n_inputs = 3 if check == "attention" else 1
    _, mask_default, guessed = mask_parameter(fn, n_inputs)
    how = "declared"
    conv = convention
    if convention == "auto":
        conv, how = guessed, "from the signature"
        if check == "softmax":
            conv = "none"
    if check == "masked-softmax" and conv == "none":
        raise ValueError("check_masked_softmax: fn takes no mask argument; "
                         "pass convention='valid_lens', 'masked' or 'keep'")
    target, errors = _probe(fn, check, conv, mask_default, spec, name, load)
    if target is None:
        if any("output shape" in e for e in errors):
            report.add(Finding("shape", "fn could not be called with any input layout: "
                               + "; ".join(errors)))
        else:
            report.add(_call_failed(fn, check, errors))
        return
    run = Run(target)
    if conv is None:
        found = _polarity_probe(run)
        conv, how = (found, "from behaviour") if found else ("keep", "assumed")
        target.convention = conv
    report.framework = target.framework.name
    report.convention = f"{conv} ({how})"
    if check == "attention":
        report.layout = "(B, H, T, D)" if target.heads else "(B, T, D)"
    torch_fn = target.framework.name == "torch"
    if check == "attention":
        mask = None if conv == "none" else ("lens" if conv == "valid_lens" else "mask")
        cases = attention_cases(target.heads, mask, conv == "sdpa", torch_fn)
    elif check == "softmax":
        cases = softmax_cases(torch_fn)
    else:
        cases = masked_softmax_cases(conv == "valid_lens", torch_fn)
    random = _nondeterministic(run, fn, cases[0])
    if random is not None:  # every comparison below would be noise
        report.cases.append(cases[0].label(check != "attention"))
        report.add(random)
        return
    for case in cases:
        report.cases.append(case.label(check != "attention"))
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
            report.add(Finding(v.code, v.message, v.measured, used.label(check != "attention"),
                               function_reproducer(run, used, v)))


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


def check_masked_softmax(fn: Any, convention: str = "auto") -> Report:
    """Judge ``fn(x, valid_lens)`` (d2l) or ``fn(x, mask)`` against
    :func:`attnkit.numpy.masked_softmax`, ``x`` being ``(B, Tq, Tk)``.

    Args:
        fn: a NumPy or PyTorch function.
        convention: ``"auto"`` (from the argument's name; a mask's polarity from
            behaviour), ``"valid_lens"``, ``"masked"`` (True = masked) or ``"keep"``
            (True = may attend).
    """
    return _check(fn, "masked-softmax", convention)


def check_attention(fn: Any, convention: str = "auto") -> Report:
    """Judge a scaled dot-product attention ``fn(q, k, v[, mask])`` against the float64
    oracle (:func:`attnkit.testing.reference_attention`).

    Args:
        fn: a NumPy or PyTorch function (or an ``nn.Module`` without parameters), taking
            ``(B, H, T, D)`` or ``(B, T, D)`` inputs (detected), returning ``out`` or
            ``(out, weights)``.
        convention: ``"auto"``, ``"valid_lens"``, ``"masked"``, ``"keep"``, ``"sdpa"`` or
            ``"none"`` (see :mod:`attnkit.check.adapt`).

    Returns:
        A :class:`Report`; ``report.ok`` is False when any finding is an error.
    """
    return _check(fn, "attention", convention)
