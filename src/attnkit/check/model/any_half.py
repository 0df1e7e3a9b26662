"""A model whose forward raises, or returns NaN/inf, in half precision where float32 runs
finite: ``float16-overflow`` with its cause (:func:`.half.half_cause`: a constant of the
module that raised, and its line), not a refusal. The module is the innermost one of the
model whose code was running when the error was raised (or the first to return NaN/inf from
finite inputs); the float32 twin is a copy of the model, the model untouched."""

from __future__ import annotations

import copy
from typing import Any

from ..catalogue import T, Text
from .half import half_cause
from .session import first_line

__all__ = ["half_non_finite", "half_raise"]


def _half_dtype(model: Any, args: tuple, kwargs: dict) -> str:
    """``"float16"``/``"bfloat16"`` when the model's weights or its float inputs are."""
    import torch

    tensors = [p for p in model.parameters()] + [
        x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor)]
    for t in tensors:
        if t.dtype in (torch.float16, torch.bfloat16):
            return str(t.dtype).replace("torch.", "")
    return ""


def _float32(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_float32(y) for y in x)
    if isinstance(x, dict):
        return {n: _float32(y) for n, y in x.items()}
    return x


def _finite(x: Any) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return not x.is_floating_point() or bool(torch.isfinite(x).all())
    if isinstance(x, (tuple, list)):
        return all(_finite(y) for y in x)
    if isinstance(x, dict):
        return all(_finite(y) for y in x.values())
    return True


def _raiser(model: Any, err: BaseException) -> tuple[str, Any]:
    """``(name, module)`` of the innermost module of ``model`` running when ``err`` was
    raised (``("", model)`` when none is found)."""
    names = {id(m): n for n, m in model.named_modules()}
    found: tuple[str, Any] = ("", model)
    tb = err.__traceback__
    while tb is not None:
        me = tb.tb_frame.f_locals.get("self")
        if id(me) in names:
            found = (names[id(me)], me)
        tb = tb.tb_next
    return found


def half_raise(model: Any, args: tuple, kwargs: dict, err: Exception,
               label: str) -> tuple[str, Text, str] | None:
    """``(layer, message, measured)`` of a forward that raised ``err`` in half precision
    and runs to a finite output in float32, or None (float32 fails too, or no half
    precision)."""
    import torch

    dtype = _half_dtype(model, args, kwargs)
    if not dtype:
        return None
    try:
        twin = copy.deepcopy(model).float()
        with torch.no_grad():
            if not _finite(twin(*_float32(args), **_float32(kwargs))):
                return None
    except Exception:  # float32 fails as well: not a matter of precision
        return None
    name, module = _raiser(model, err)
    error = f"{type(err).__name__}: {first_line(err)}"
    cause = half_cause(dtype, error, None, module)
    return name, T("any.half-forward", label=label, dtype=dtype, error=error,
                   cause=cause), type(err).__name__


def _first_non_finite(model: Any, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """``(name, module)`` of the first module of ``model`` to return NaN/inf from finite
    inputs (modules finish inner first: the one whose own code made it), run again."""
    import torch

    found: list[tuple[str, Any]] = []

    def hook(name: str) -> Any:
        def after(module: Any, inputs: tuple, kw: dict, out: Any) -> None:
            if not found and not _finite(out) and _finite(inputs) and _finite(kw):
                found.append((name, module))
        return after

    handles = [m.register_forward_hook(hook(n), with_kwargs=True)
               for n, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else ("", model)


def half_non_finite(model: Any, args: tuple, kwargs: dict, out: Any,
                    label: str) -> tuple[str, Text, str] | None:
    """``(layer, message, measured)`` of a forward whose output ``out`` holds NaN/inf in
    half precision while the float32 twin's is finite, or None."""
    import torch

    dtype = _half_dtype(model, args, kwargs)
    if not dtype or _finite(out):
        return None
    try:
        with torch.no_grad():
            if not _finite(copy.deepcopy(model).float()(*_float32(args), **_float32(kwargs))):
                return None
    except Exception:  # float32 fails: not a matter of precision
        return None
    name, module = _first_non_finite(model, args, kwargs)
    cause = half_cause(dtype, "NaN/inf in the output", None, module)
    return name, T("any.half-forward-nan", label=label, dtype=dtype, cause=cause), "NaN/inf"
