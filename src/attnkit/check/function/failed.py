"""When no call of a function works: which try to lead with, and a reproducer that makes
that try again and fails as it did (``call-failed``, ``shape`` before any case ran, and the
``one-sequence`` warning of a function that takes no batch).
"""

from __future__ import annotations

import re
import traceback
from dataclasses import replace
from typing import Any

from ..catalogue import T, Text, join
from ..core.report import Finding
from ..core.repro import note, said
from ..meet.adapt import Call
from ..meet.calls import Target
from .detect import probe, probe_case
from .unbatched import WRAPPER, unbatched

__all__ = ["attempt_reproducer", "find_target", "leading_attempt"]

# Errors that say the function ran into mismatched shapes inside (NumPy, PyTorch).
_SHAPE_ERROR = re.compile(r"could not be broadcast|must match the size|size of tensor a|"
                          r"shapes cannot be multiplied|mismatch in its core dimension|"
                          r"not aligned")


def find_target(fn: Any, check: str, conv: str | None, call: Call, spec: str | None,
                name: str, causal: bool, load: str
                ) -> tuple[Target | None, Call, dict[str, str], Finding | None]:
    """How ``fn`` can be called, as it is, then with a mask every time (it raises on its
    own default, ``mask=None`` used unguarded), then one sequence at a time (it takes 2-D
    inputs: ``q @ k.T``).

    Returns:
        ``(target, call, notes, finding)``: the target (None when nothing worked, and the
        finding says why: ``call-failed`` or ``shape``, with a reproducer), the call it
        takes, notes for the report (``"default"``: the default that raises; ``"one-
        sequence"``), and for a function that takes one sequence the ``one-sequence``
        warning.
    """
    attempts: list = []
    target, errors = probe(fn, check, conv, call, spec, name, causal, load, attempts)
    if target is not None:
        return target, call, {}, None
    notes: dict[str, Any] = {}
    if call.mask_name and call.mask_default and conv != "none":
        target, _ = probe(fn, check, conv, replace(call, mask_default=False), spec, name,
                          causal, load)
        if target is not None:
            lead = errors[leading_attempt(fn, attempts)]
            notes["default"] = T("header.default-raises", name=call.mask_name,
                                 error=lead.split(": ", 1)[-1])
            return target, target.call, notes, None
    base = load or (f"fn = load_target({spec!r})" if spec else f"fn = {name}"
                    if name.isidentifier() else note("fn = ...", "repro.fn-here"))
    target, _ = probe(unbatched(fn), check, conv, call, spec, name, causal,
                      join([base, "one = fn", WRAPPER], "line"))
    if target is not None:
        notes["one-sequence"] = "yes"
        return target, call, notes, _one_sequence(fn, errors, attempts)
    return None, call, notes, _failure(fn, check, call, errors, attempts)


def _one_sequence(fn: Any, errors: list[str], attempts: list) -> Finding:
    i = leading_attempt(fn, attempts)
    t, error, expected = attempts[i]
    what = errors[i].split(": ", 1)[-1]
    return Finding(
        "one-sequence", T("call.one-sequence", error=what), errors[i],
        case=T("case.batched-inputs"),
        reproducer=attempt_reproducer(t, error, expected))


def _failure(fn: Any, check: str, call: Call, errors: list[str], attempts: list) -> Finding:
    """The finding of a function no try could call."""
    shaped = [i for i, a in enumerate(attempts) if a[2] is not None]
    if shaped:
        t, error, expected = attempts[shaped[0]]
        return Finding("shape", T("call.no-layout", tries=join(errors)),
                       reproducer=attempt_reproducer(t, error, expected))
    broken = [i for i, e in enumerate(errors) if _SHAPE_ERROR.search(e)]
    if broken:
        # It was called and failed inside, on its own arithmetic: a shape bug (a sum
        # without keepdims, k where k.T was meant), not a call the check got wrong.
        t, error, expected = attempts[broken[0]]
        return Finding("shape", T("call.shape-error", first=errors[broken[0]]),
                       T("measured.tried", n=len(errors), tries=join(errors)),
                       reproducer=attempt_reproducer(t, error, expected))
    finding = _call_failed(fn, check, call, errors, leading_attempt(fn, attempts))
    if attempts:
        t, error, expected = attempts[leading_attempt(fn, attempts)]
        finding.reproducer = attempt_reproducer(t, error, expected)
    return finding


def _call_failed(fn: Any, check: str, call: Call, errors: list, lead: int) -> Finding:
    args = "fn(q, k, v[, mask])" if check == "attention" else (
        "fn(x, mask)" if check == "masked-softmax" else "fn(x)")
    layouts = T("call.layouts-attention" if check == "attention" else "call.layouts")
    fix: Text = T("call.fix", args=args)
    if call.unfilled:
        fix = T("call.fix-unfilled", names=", ".join(call.unfilled), first=call.unfilled[0],
                fix=fix)
    if callable(getattr(fn, "forward", None)):
        fix = T("call.fix-instance", fix=fix)
    first = errors[lead] if errors else T("call.no-output")
    return Finding("call-failed", T("call.failed", layouts=layouts, first=first, fix=fix),
                   T("measured.tried", n=len(errors), tries=join(errors)))


def _progress(fn: Any, error: BaseException | None) -> int:
    """How far into ``fn``'s own source a try got before ``error``: the largest line number
    of a frame in ``fn``'s file (0 when it never got there)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        code = getattr(getattr(fn, "forward", None), "__code__", None)
    if error is None or code is None:
        return 0
    lines = [frame.lineno or 0 for frame in traceback.extract_tb(error.__traceback__)
             if frame.filename == code.co_filename]
    return max(lines, default=0)


def leading_attempt(fn: Any, attempts: list) -> int:
    """The index of the try that stopped the call: of those that raised, the one that got
    furthest into ``fn``'s own code (a NumPy array refused on the first line says less
    than the error the right framework met further down); on a tie, the first try of a
    module's own framework (PyTorch for an ``nn.Module``), else the first try."""
    owner = getattr(fn, "__self__", fn)
    torch_owned = type(owner).__module__.startswith("torch") or any(
        c.__module__.startswith("torch.nn") for c in type(owner).__mro__[1:])
    best, score = 0, (-1, False)
    for i, (t, error, _) in enumerate(attempts):
        progress = (_progress(fn, error) if error is not None else -1,
                    torch_owned and t.framework.name == "torch")
        if progress > score:
            best, score = i, progress
    return best


def attempt_reproducer(t: Target, error: BaseException | None, expected: Any) -> Text:
    """Lines that call ``t.fn`` as one try of the probe did: they raise what it raised, or
    (``expected``, an output shape) fail an assert on the shape it returned."""
    from ..core.judge import Run

    case = probe_case(t)
    run = Run(t)
    arrays = run.arrays(case)
    lines = [ln for ln in t.header("") + [run.setup(case)] if ln]
    lines += t.convert_lines(case.dtype)
    call = t.got_lines(arrays, case.causal, case.dtype)
    if error is not None:
        return join(lines + [note(call[0], "repro.raises-name", error=type(error).__name__)],
                    "line")
    lines += call[:2]
    if expected is None:
        return join(lines + [f"assert isinstance(out, {_array_type(t)}), f"
                             + said("repro.not-array", type="{type(out).__name__}")], "line")
    return join(lines + [f"assert tuple(out.shape) == {tuple(expected)!r}, out.shape"], "line")


def _array_type(t: Target) -> str:
    return "torch.Tensor" if t.framework.name == "torch" else "np.ndarray"
