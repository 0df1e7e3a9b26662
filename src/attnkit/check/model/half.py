"""Why an attention call of a model fails in half precision where float32 is fine, in
words: the cause read off the code that can be read (the implementation under test, the
module that made the call), as the function check names it (:mod:`..core.overflow`: a
constant and its line, a dtype helper, a float32 tensor attribute), or a number the module
keeps as a setting; where no code of the user's can be read, what was measured and the
kinds of cause, never a constant the code was not seen to hold."""

from __future__ import annotations

import math
from typing import Any

from ..catalogue import T, Text
from ..core.overflow import FLOAT16_MAX, has_source, overflow_cause

__all__ = ["half_cause"]

# Code that ships with these packages is not the user's: a cause is not looked for there.
_SHIPPED = ("torch.", "transformers.", "attnkit.", "numpy.")


def _users(obj: Any) -> bool:
    """``obj`` (a function, or a module: its class) is defined outside the libraries."""
    if obj is None:
        return False
    home = type(obj).__module__ if hasattr(obj, "forward") else \
        getattr(obj, "__module__", None)
    return not (home or "").startswith(_SHIPPED)


def _own(obj: Any) -> bool:
    """``obj`` is the user's code, and its source can be read."""
    return _users(obj) and has_source(obj)


def _big_setting(module: Any) -> tuple[str, float] | None:
    """A plain float setting of ``module`` that float16 cannot hold (``self.fill =
    -1e9``), as ``(name, value)``."""
    for name, value in vars(module).items():
        if isinstance(value, float) and math.isfinite(value) and abs(value) > FLOAT16_MAX:
            return name, value
    return None


def half_cause(dtype: str, problem: str, fn: Any = None, module: Any = None) -> Text:
    """The cause of a half-precision failure of one attention call, and its fix.

    Args:
        dtype: ``"float16"`` or ``"bfloat16"``.
        problem: the exception as ``"Type: first line"``, or ``"NaN/inf in the output"``.
        fn: the attention function that ran (the implementation under test, or the
            library's own), or None.
        module: the module the call came from (an ``nn.MultiheadAttention``: the module
            itself), or None.

    Returns:
        One sentence: the cause the user's code has (a constant and its line, a setting,
        a dtype helper, a float32 attribute), else the kinds of cause when code was read
        and none was found, else (no code of the user's could be read) the kinds of cause
        with the code named as not read.
    """
    read = [obj for obj in (fn, module) if _own(obj)]
    # a float32 tensor kept on a module is named only for an error that mixes dtypes (a
    # model may keep one on purpose, e.g. rotary tables; it overflows nothing)
    said = problem.lower()
    mixes = "expected" in said and any(w in said for w in ("half", "bfloat16", "dtype"))
    for obj in read:
        half_copy = obj if mixes and hasattr(obj, "named_modules") else None
        cause = overflow_cause(obj, dtype, problem, half_copy)
        if cause.key != "overflow.range":
            return cause
    setting = _big_setting(module) if _users(module) and dtype == "float16" else None
    if setting is not None:
        return T("overflow.setting", attr=f"self.{setting[0]}", value=repr(setting[1]))
    return T("overflow.range", dtype=dtype) if read else T("overflow.unread", dtype=dtype)
