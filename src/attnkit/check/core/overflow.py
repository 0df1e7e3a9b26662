"""Why code fails in half precision where float32 is fine, read off the code itself, so
that ``float16-overflow`` names the cause it has: a constant that float16 cannot hold (and
where it is written), a dtype helper with no entry for the dtype, a float32 tensor kept on
a module as a plain attribute (``.half()`` converts parameters and buffers only), a float32
tensor made in ``forward`` meeting the half-precision values. Never a constant the code
does not contain.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

from ..catalogue import T, Text

__all__ = ["FLOAT16_MAX", "fill_words", "has_source", "overflow_cause"]

FLOAT16_MAX = 65504.0
# torch's words for two operands of different dtypes meeting (a float32 tensor made in
# forward with no dtype=, meeting the half-precision values)
_MIXED = re.compile(r"same dtype|dtypes must be the same|expected scalar type|"
                    r"must have the same dtype|dtype mismatch", re.IGNORECASE)


def _routines(obj: Any) -> list[Any]:
    """The function, or every method of a module's class but its constructor."""
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    if inspect.isroutine(obj):
        return [obj]
    cls = obj if inspect.isclass(obj) else type(obj)
    return [f for name, f in inspect.getmembers(cls, inspect.isfunction)
            if name != "__init__" and f.__module__ == cls.__module__]


def _sources(obj: Any) -> list[tuple[str, int]]:
    """``(source, first line)`` of each of :func:`_routines`."""
    return [(source, start) for source, start, _ in _read(obj)]


def _read(obj: Any) -> list[tuple[str, int, dict[str, Any]]]:
    """``(source, first line, the names it reads from its module or closure)`` of each of
    :func:`_routines` whose source can be read."""
    found = []
    for f in _routines(obj):
        try:
            lines, start = inspect.getsourcelines(f)
        except (OSError, TypeError):
            continue
        try:
            seen = inspect.getclosurevars(f)
            names = {**seen.globals, **seen.nonlocals}
        except (TypeError, ValueError):
            names = {}
        found.append(("".join(lines), start, names))
    return found


def _too_big(value: Any) -> bool:
    """A number (not a bool) that float16 cannot hold."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and abs(value) > FLOAT16_MAX


def has_source(obj: Any) -> bool:
    """Whether the source of ``obj`` (a function, or a module's methods) can be read."""
    return bool(_sources(obj))


def _constants(obj: Any) -> list[tuple[str, str]]:
    """``(constant as written, its line)`` of numbers float16 cannot hold."""
    found: list[tuple[str, str]] = []
    for source, _, names in _read(obj):
        text = textwrap.dedent(source)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            value = node
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                value = node.operand
            if isinstance(value, ast.Name) and _too_big(names.get(value.id)):
                # a constant kept under a name (NEG_INF = -1e9 at the top of the file)
                written = f"{value.id} = {names[value.id]!r}"
            elif isinstance(value, ast.Constant) and _too_big(value.value):
                written = ast.get_source_segment(text, node) or repr(value.value)
            else:
                continue
            line = lines[node.lineno - 1].strip()
            if (written, line) not in found and not any(written in w for w, _ in found):
                found.append((written, line))
    return [(w, ln) for w, ln in found if not any(w != o and w in o for o, _ in found)]


def _float32_attributes(module: Any) -> list[str]:
    """Names of plain tensor attributes a half-precision copy of ``module`` still keeps in
    float32 (not parameters, not buffers: ``.half()`` does not see them)."""
    try:
        import torch
    except ImportError:
        return []
    names = []
    for path, sub in getattr(module, "named_modules", list)():
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                names.append(f"{path}.{attr}" if path else attr)
    return names


def overflow_cause(obj: Any, dtype: str, problem: str, half_copy: Any = None) -> Text:
    """The cause of a half-precision failure and its fix, in words.

    Args:
        obj: the checked function or module.
        dtype: ``"float16"`` or ``"bfloat16"``.
        problem: what went wrong (the exception's text, or "NaN/inf in the output").
        half_copy: for a module, its copy in ``dtype`` (float32 attributes left on it).

    Returns:
        One sentence naming the cause the code has, and what to do.
    """
    attrs = _float32_attributes(half_copy) if half_copy is not None else []
    if not attrs and _MIXED.search(problem):
        return T("overflow.mixed", dtype=dtype)
    if dtype in problem or "BFloat16" in problem or "Half" in problem and "expected" in problem:
        if not attrs:
            return T("overflow.helper", dtype=dtype)
    if attrs:
        return T("overflow.attribute", attr=f"self.{attrs[0]}",
                 name=repr(attrs[0].split(".")[-1]))
    constants = _constants(obj)
    if dtype == "float16" and constants:
        written, line = constants[0]
        return T("overflow.constant", constant=written, line=repr(line))
    return T("overflow.range", dtype=dtype)


def fill_words(obj: Any) -> Text:
    """"a large negative fill" and the one the code has, if it has one (``-1e9 here``)."""
    big = [w for w, _ in _constants(obj) if w.startswith("-") or " = -" in w]
    return T("overflow.fill-here", value=big[0]) if big else T("overflow.fill")
