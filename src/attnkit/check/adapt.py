"""Meeting the user's code where it is: loading a target, telling NumPy from PyTorch,
reading a calling convention off a signature, and turning results back into float64.

Conventions (what the argument after the inputs means):

==============  ==========================================================================
``valid_lens``  ``fn(q, k, v, valid_lens)``: keys ``j < valid_lens[b]`` are valid (d2l)
``masked``      ``fn(q, k, v, mask)``: bool, True = masked out (the notes' convention)
``keep``        ``fn(q, k, v, mask)``: bool, True = may attend (JAX, attnkit)
``sdpa``        ``fn(q, k, v, attn_mask=None, is_causal=False)``: bool True = may attend
``none``        ``fn(q, k, v)``: no mask argument
==============  ==========================================================================
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
import types
from typing import Any

import numpy as np

__all__ = ["CONVENTIONS", "Framework", "TargetLoadError", "load_target", "mask_parameter",
           "notebook_cells", "origin_of", "target_spec", "unwrap"]

CONVENTIONS = ("auto", "valid_lens", "masked", "keep", "sdpa", "none")
LENS_NAMES = ("valid_lens", "valid_len", "valid_length", "valid_lengths", "lens", "lengths",
               "seq_lens", "key_lens")


class TargetLoadError(RuntimeError):
    """The target's own code raised while it was loaded (importing its file, running a
    notebook cell): the checker reports it as ``call-failed`` rather than crash."""


# Objects load_target returned: id -> (the object, kept alive so the id stays its own,
# the spec that finds it again, where it was defined). Reproducers load the same target.
_LOADED: dict[int, tuple[Any, str, str]] = {}
_NOTEBOOK_MAGIC = ("%", "!")


def load_target(spec: str) -> Any:
    """The object named by ``"path/to/file.py:name"``, ``"notes.ipynb:name"`` or
    ``"package.module:name"``.

    ``name`` may be dotted (``"module:Class.method"``, ``"file.py:layer.forward"``, a
    bound method of a module-level instance). A file is imported under its stem, with its
    folder put first on ``sys.path`` (so its own imports resolve). A notebook's code cells
    run in order, in a fresh namespace, until ``name`` is defined (lines and cells that are
    IPython magics or shell commands, starting with ``%`` or ``!``, are skipped).

    Raises:
        ValueError: the spec is malformed, the file or the name does not exist.
        ImportError: ``package.module`` cannot be found.
        TargetLoadError: the target's own code raised (importing the file, a cell).
    """
    if ":" not in spec:
        raise ValueError(f"expected FILE.py:NAME, NOTEBOOK.ipynb:NAME or package.module:NAME, "
                         f"got {spec!r}")
    where, name = spec.rsplit(":", 1)
    origin, found_again = "", spec
    if where.endswith((".py", ".ipynb")) or os.sep in where or "/" in where:
        found_again = f"{os.path.abspath(where)}:{name}"
    if where.endswith(".ipynb"):
        module, origin = _run_notebook(where, name.split(".")[0])
    elif where.endswith(".py") or os.sep in where or "/" in where:
        module = _import_file(where)
        origin = f"defined in {os.path.basename(where)}"
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            if getattr(err, "name", None) and where.startswith(str(err.name)):
                raise  # the module named is not there: a bad argument
            raise TargetLoadError(f"importing {where} raised {type(err).__name__}: "
                                  f"{_first_line(err)}") from err
        except Exception as err:
            raise TargetLoadError(f"importing {where} raised {type(err).__name__}: "
                                  f"{_first_line(err)}") from err
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec}: {where} has no attribute {part!r}")
        obj = getattr(obj, part)
    _LOADED[id(obj)] = (obj, found_again, origin)
    return obj


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


def _import_file(where: str) -> Any:
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
        try:
            loader_spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:
            del sys.modules[module_name]
            raise TargetLoadError(f"importing {where} raised {type(err).__name__}: "
                                  f"{_first_line(err)}") from err
    return module


def notebook_cells(path: str) -> list[tuple[int, str]]:
    """``(cell number, source)`` of a notebook's code cells, numbered from 1 over all its
    cells (markdown included, as they appear), magics and shell lines left out."""
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a Jupyter notebook ({type(err).__name__}: "
                         f"{_first_line(err)})") from err
    found = []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if text.lstrip().startswith("%%"):
            continue  # a cell magic: the whole cell is not Python
        lines = [line for line in text.splitlines()
                 if not line.lstrip().startswith(_NOTEBOOK_MAGIC)]
        found.append((number, "\n".join(lines)))
    return found


def _run_notebook(where: str, name: str) -> tuple[Any, str]:
    path = os.path.abspath(where)
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such file")
    base = os.path.basename(path)
    stem = os.path.splitext(base)[0]
    module_name = f"_attnkit_check_{stem}_ipynb_{abs(hash((path, name))) % 10**8}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module, module.__dict__.get("__attnkit_origin__", "")
    module = types.ModuleType(module_name)
    module.__file__ = path
    module.display = print  # IPython's display(), which notebooks call as a builtin
    sys.modules[module_name] = module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    for number, source in notebook_cells(path):
        try:
            exec(compile(source, f"{base}, cell {number}", "exec"), module.__dict__)
        except (Exception, SystemExit) as err:
            del sys.modules[module_name]
            raise TargetLoadError(f"cell {number} of {base} raised {type(err).__name__} "
                                  f"before {name!r} was defined: {_first_line(err)}") from err
        if name in module.__dict__:
            origin = f"defined in cell {number} of {base}"
            module.__attnkit_origin__ = origin
            return module, origin
    del sys.modules[module_name]
    raise ValueError(f"{where}: no code cell defines {name!r}")


def origin_of(obj: Any) -> str:
    """Where ``obj`` was found, for the report (``"defined in cell 3 of notes.ipynb"``), or
    ``""`` when it was not loaded by :func:`load_target`."""
    entry = _LOADED.get(id(obj))
    if entry is not None and entry[0] is obj:
        return entry[2] if ".ipynb" in entry[1] else ""
    return ""


def target_spec(obj: Any) -> str | None:
    """A ``load_target`` string that finds ``obj`` again, or None (a lambda, a closure, an
    object no module names)."""
    entry = _LOADED.get(id(obj))
    if entry is not None and entry[0] is obj:
        return _relative(entry[1])
    if inspect.ismethod(obj):  # a bound method: the instance's name, then the method's
        owner = target_spec(obj.__self__)
        return f"{owner}.{obj.__func__.__name__}" if owner else None
    qualname = getattr(obj, "__qualname__", None)
    if qualname is None or "<" in qualname:
        return _instance_spec(obj) if qualname is None else None
    module_name = getattr(obj, "__module__", None)
    module = sys.modules.get(module_name or "")
    if module_name and module_name.startswith("_attnkit_check_") or module_name == "__main__":
        path = getattr(module, "__file__", None)
        if not path:
            return None
        return f"{_relative(os.path.abspath(path))}:{qualname}"
    if module is None:
        return None
    try:
        found = load_target(f"{module_name}:{qualname}")
    except (ValueError, ImportError, TargetLoadError):
        return None
    return f"{module_name}:{qualname}" if found is obj else None


def _instance_spec(obj: Any) -> str | None:
    """The spec of an instance kept under a name at the top of its class's module."""
    module_name = getattr(type(obj), "__module__", "")
    module = sys.modules.get(module_name)
    if module is None:
        return None
    names = [k for k, v in vars(module).items() if v is obj and not k.startswith("_")]
    if not names:
        return None
    where = module_name
    if module_name.startswith("_attnkit_check_") or module_name == "__main__":
        path = getattr(module, "__file__", None)
        if not path:
            return None
        where = _relative(os.path.abspath(path))
    return f"{where}:{names[0]}"


def _relative(spec: str) -> str:
    """A file spec relative to the working folder when it lies under it."""
    where, _, name = spec.rpartition(":")
    if not (where.endswith((".py", ".ipynb")) or os.sep in where) or not os.path.isabs(where):
        return spec
    rel = os.path.relpath(where)
    return f"{where if rel.startswith('..') else rel}:{name}"


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
