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

from .adapt import CONVENTIONS, Framework, mask_parameter, target_spec, unwrap
from .calls import Target
from .cases import Case, attention_cases, masked_softmax_cases, softmax_cases
from .judge import Run, first_line
from .report import Finding, Report
from .repro import function_reproducer

__all__ = ["check_attention", "check_masked_softmax", "check_softmax"]


# -- detection --------------------------------------------------------------------------------
def _probe(fn: Any, check: str, convention: str | None, mask_default: bool,
           spec: str | None, name: str) -> tuple[Target | None, list[str]]:
    """Find the framework (and, for attention, the layout) ``fn`` runs with."""
    frameworks = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    errors = []
    for fw_name in frameworks:
        fw = Framework(fw_name)
        for heads in ((True, False) if check == "attention" else (True,)):
            t = Target(fn, check, fw, convention or "keep", heads, mask_default, spec, name)
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
    # The user's code may overflow on purpose of the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _check_quietly(fn, check, convention)


def _check_quietly(fn: Any, check: str, convention: str) -> Report:
    t0 = time.perf_counter()
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    n_inputs = 3 if check == "attention" else 1
    _, mask_default, guessed = mask_parameter(fn, n_inputs)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    spec = target_spec(fn)
    report = Report(check, spec or name)
    how = "declared"
    conv = convention
    if convention == "auto":
        conv, how = guessed, "from the signature"
        if check == "softmax":
            conv = "none"
    if check == "masked-softmax" and conv == "none":
        raise ValueError("check_masked_softmax: fn takes no mask argument; "
                         "pass convention='valid_lens', 'masked' or 'keep'")
    target, errors = _probe(fn, check, conv, mask_default, spec, name)
    if target is None:
        report.add(Finding("shape", "fn could not be called with any input layout: "
                           + "; ".join(errors)))
        report.seconds = time.perf_counter() - t0
        return report
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
    report.seconds = time.perf_counter() - t0
    return report


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
