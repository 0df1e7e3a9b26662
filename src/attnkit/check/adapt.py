"""Meeting the user's code where it is: loading a target, telling NumPy from PyTorch,
reading a calling convention off a signature, and turning results back into float64.

Conventions (what the argument after the inputs means):

==============  ==========================================================================
``valid_lens``  ``fn(q, k, v, valid_lens)``: keys ``j < valid_lens[b]`` are valid (d2l)
``masked``      ``fn(q, k, v, mask)``: bool, True = masked out (masked_fill(mask, ...) code)
``keep``        ``fn(q, k, v, mask)``: bool, True = may attend (JAX, attnkit)
``sdpa``        ``fn(q, k, v, attn_mask=None, is_causal=False)``: bool True = may attend
``none``        ``fn(q, k, v)``: no mask argument
==============  ==========================================================================
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

import numpy as np

__all__ = ["CONVENTIONS", "Framework", "load_target", "mask_parameter", "target_spec", "unwrap"]

CONVENTIONS = ("auto", "valid_lens", "masked", "keep", "sdpa", "none")
LENS_NAMES = ("valid_lens", "valid_len", "valid_length", "valid_lengths", "lens", "lengths",
               "seq_lens", "key_lens")


def load_target(spec: str) -> Any:
    """The object named by ``"path/to/file.py:name"`` or ``"package.module:name"``.

    ``name`` may be dotted (``"module:Class.method"``). A file is imported under its stem,
    with its folder put first on ``sys.path`` (so its own imports resolve).
    """
    if ":" not in spec:
        raise ValueError(f"expected FILE.py:NAME or package.module:NAME, got {spec!r}")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise ValueError(f"{where}: no such file")
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        stem = os.path.splitext(os.path.basename(path))[0]
        module_name = f"_attnkit_check_{stem}_{abs(hash(path)) % 10**8}"
        module = sys.modules.get(module_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ValueError(f"{where}: cannot be imported as Python")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec}: {where} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def target_spec(obj: Any) -> str | None:
    """A ``load_target`` string that finds ``obj`` again, or None (a lambda, a closure)."""
    qualname = getattr(obj, "__qualname__", None) or getattr(type(obj), "__qualname__", None)
    if qualname is None or "<" in qualname:
        return None
    if not hasattr(obj, "__qualname__"):  # an instance: it cannot be named
        return None
    module_name = getattr(obj, "__module__", None)
    module = sys.modules.get(module_name or "")
    if module_name and module_name.startswith("_attnkit_check_") or module_name == "__main__":
        path = getattr(module, "__file__", None)
        if not path:
            return None
        path = os.path.abspath(path)
        rel = os.path.relpath(path)
        return f"{path if rel.startswith('..') else rel}:{qualname}"
    if module is None:
        return None
    try:
        found = load_target(f"{module_name}:{qualname}")
    except (ValueError, ImportError):
        return None
    return f"{module_name}:{qualname}" if found is obj else None


def unwrap(result: Any) -> tuple[Any, Any]:
    """``(out, weights or None)`` from ``out`` or ``(out, weights)``."""
    if isinstance(result, (tuple, list)):
        if len(result) == 0:
            raise TypeError("fn returned an empty tuple")
        return result[0], (result[1] if len(result) > 1 else None)
    return result, None


def mask_parameter(fn: Any, n_inputs: int) -> tuple[str | None, bool, str | None]:
    """``(name, has_default, convention guessed from the names)`` of the parameter after
    the ``n_inputs`` inputs; name None when there is none or the signature is unreadable."""
    if not inspect.isroutine(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # an nn.Module: its forward says what it takes
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, True, None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    if "attn_mask" in names and "is_causal" in names and n_inputs == 3:
        return "attn_mask", True, "sdpa"
    if len(positional) <= n_inputs:
        return None, True, "none"
    p = positional[n_inputs]
    has_default = p.default is not inspect.Parameter.empty
    if p.name.lower() in LENS_NAMES:
        return p.name, has_default, "valid_lens"
    if "mask" in p.name.lower():
        return p.name, has_default, None  # polarity: read off behaviour
    return p.name, has_default, None


class Framework:
    """How inputs are made and results read, for ``"numpy"`` or ``"torch"``."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import torch

            self.torch = torch

    def array(self, x: np.ndarray, dtype: str, requires_grad: bool = False) -> Any:
        """``x`` in ``dtype`` (bool and integer arrays keep their own dtype)."""
        x = np.asarray(x)
        if self.name == "numpy":
            return x.astype(dtype) if x.dtype.kind == "f" else x.copy()
        t = self.torch.from_numpy(np.array(x))
        if x.dtype.kind == "f":
            t = t.to(getattr(self.torch, dtype))
            if requires_grad:
                t.requires_grad_(True)
        return t

    def float64(self, x: Any) -> np.ndarray:
        """A float64 NumPy copy of an array or tensor."""
        if hasattr(x, "detach"):
            return x.detach().cpu().double().numpy()
        return np.array(x, dtype=np.float64)

    def rounded(self, x: np.ndarray, dtype: str) -> np.ndarray:
        """``x`` rounded to ``dtype`` and back to float64 (what ``fn`` really receives)."""
        if np.asarray(x).dtype.kind != "f":
            return np.asarray(x)
        return self.float64(self.array(x, dtype))

    def snapshot(self, x: Any) -> Any:
        return x.detach().clone() if hasattr(x, "detach") else np.array(x, copy=True)

    def same(self, a: Any, b: Any) -> bool:
        """Equal shapes and values (NaN equal to NaN)."""
        a, b = self._numpy(a), self._numpy(b)
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))

    def _numpy(self, x: Any) -> np.ndarray:
        if hasattr(x, "detach"):
            x = x.detach().cpu()
            if x.dtype == self.torch.bfloat16:  # NumPy has none; float32 holds it exactly
                x = x.float()
            return x.numpy()
        return np.asarray(x)

    def is_result(self, x: Any) -> bool:
        if self.name == "torch":
            return isinstance(x, self.torch.Tensor)
        return isinstance(x, np.ndarray)

    # -- text for reproducers ---------------------------------------------------------
    def imports(self) -> list[str]:
        return ["import numpy as np"] + (["import torch"] if self.name == "torch" else [])

    def convert_text(self, name: str, dtype: str, grad: bool = False) -> str:
        """Code that turns the float64 NumPy array ``name`` into ``fn``'s input."""
        if self.name == "numpy":
            return f"{name}.astype(np.{dtype})" if dtype else f"{name}.copy()"
        if not dtype:
            return f"torch.from_numpy({name}.copy())"
        return (f"torch.from_numpy({name}).to(torch.{dtype})"
                + (".requires_grad_()" if grad else ""))

    def to_float64_text(self, name: str) -> str:
        if self.name == "torch":
            return f"{name}.detach().double().numpy()"
        return f"np.asarray({name}, dtype=np.float64)"
