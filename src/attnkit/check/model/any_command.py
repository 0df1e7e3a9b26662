"""What ``attnkit check model`` needs for a model that is not a transformers checkpoint: the
model from ``FILE.py:build_model`` (a factory, a class or an instance), inputs read from a
``.pt`` or ``.safetensors`` file without running code, and the user's own attention
function (``--implementation FILE.py:fn``). Each failure is a ``ValueError`` of one line
that says what to do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..catalogue import T, Text
from ..meet.targets import TargetLoadError, load_target
from .session import first_line

__all__ = ["is_target_spec", "load_any_model", "load_implementation", "read_inputs"]


def is_target_spec(spec: str) -> bool:
    """``FILE.py:NAME``, ``NOTEBOOK.ipynb:NAME`` or ``package.module:NAME`` (not a path that
    exists: a folder or a ``config.json``)."""
    if Path(spec).exists():
        return False
    return bool(re.fullmatch(r".+\.(py|ipynb):[\w.]+", spec)
                or re.fullmatch(r"[\w.]+:[\w.]+", spec))


def _load(spec: str, what: str) -> Any:
    try:
        return load_target(spec)
    except (ValueError, ImportError) as err:
        said = err.args[0] if err.args and isinstance(err.args[0], Text) else first_line(err)
        raise ValueError(T("cmd.load", what=what, spec=repr(spec), error=said)) from None
    except TargetLoadError as err:
        raise ValueError(T("cmd.import-raised", what=what, spec=repr(spec),
                           error=first_line(err))) from None


def load_any_model(spec: str, seed: int = 0) -> tuple[Any, Any]:
    """``(model, inputs or None)`` from ``FILE.py:NAME``: ``NAME`` is an ``nn.Module``
    instance, or a class or function called with no arguments (after
    ``torch.manual_seed(seed)``) that returns a module or ``(module, inputs)``.

    Raises:
        ValueError: the name does not load, calling it raises, or it gives no module.
    """
    import torch

    obj = _load(spec, "MODEL")
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise ValueError(T("cmd.not-callable", spec=repr(spec), type=type(obj).__name__))
        torch.manual_seed(seed)
        try:
            obj = obj()
        except Exception as err:  # the user's factory may raise anything
            raise ValueError(T("cmd.factory-raised", spec=repr(spec),
                               error=f"{type(err).__name__}: {first_line(err)}")) from None
    inputs = None
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
        obj, inputs = obj
    if not isinstance(obj, torch.nn.Module):
        raise ValueError(T("cmd.not-module", spec=repr(spec), type=type(obj).__name__))
    return obj, inputs


def load_implementation(spec: str) -> Any:
    """The attention function of ``--implementation FILE.py:fn`` (SDPA's signature)."""
    fn = _load(spec, "--implementation")
    if not callable(fn):
        raise ValueError(T("cmd.not-function", spec=repr(spec), type=type(fn).__name__))
    return fn


def read_inputs(path: str) -> Any:
    """The inputs saved in ``path``: a ``.pt``/``.pth`` file read with
    ``torch.load(weights_only=True)`` (a tensor, a tuple or list of them, or a dict of
    keyword arguments), or a ``.safetensors`` file (a dict of tensors: keyword
    arguments). No code in the file runs.

    Raises:
        ValueError: another suffix, a missing file, or a file that does not read.
    """
    import torch

    p = Path(path)
    if p.suffix not in (".pt", ".pth", ".safetensors"):
        raise ValueError(T("cmd.suffix", path=repr(path)))
    if not p.is_file():
        raise ValueError(T("cmd.no-file", path=repr(path)))
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(p))
        return torch.load(p, map_location="cpu", weights_only=True)
    except ImportError:
        raise ValueError(T("cmd.safetensors", path=repr(path))) from None
    except Exception as err:  # a file that is not what it says, or holds objects
        raise ValueError(T("cmd.unreadable", path=repr(path),
                           error=f"{type(err).__name__}: {first_line(err)}")) from None


def cast_inputs(inputs: Any, dtype: Any) -> Any:
    """``inputs`` with every floating-point tensor in ``dtype`` (ids and masks unchanged)."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, dict):
        return {n: cast_inputs(x, dtype) for n, x in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(cast_inputs(x, dtype) for x in inputs)
    return inputs
