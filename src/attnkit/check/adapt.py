"""Meeting the user's code where it is: loading a target, telling NumPy from PyTorch,
reading a calling convention off a signature, and turning results back into float64.

Conventions (what the argument after the inputs means):

==============  ==========================================================================
``valid_lens``  ``fn(q, k, v, valid_lens)``: keys ``j < valid_lens[b]`` are valid (d2l)
``masked``      ``fn(q, k, v, mask)``: bool, True = masked out (masked_fill(mask, ...) code)
``keep``        ``fn(q, k, v, mask)``: bool, True = may attend (JAX, attnkit)
``sdpa``        ``fn(q, k, v, attn_mask=None, is_causal=False)``: bool True = may attend
``additive``    ``fn(q, k, v, attention_mask)``: float, 0 = may attend, ``finfo.min`` =
                masked, added to the scores (transformers' eager attention)
``none``        ``fn(q, k, v)``: no mask argument
==============  ==========================================================================

The call is read off the signature (:func:`read_call`): inputs go by name where the names
say which is query, key and value; a parameter with a bool/number default or a flag's name
(``scale``, ``dropout``, ``training``, ``retain_derived``) is never fed a mask.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CONVENTIONS", "Call", "Framework", "TargetLoadError", "load_target",
           "mask_parameter", "notebook_cells", "origin_of", "read_call", "target_spec", "unwrap"]

CONVENTIONS = ("auto", "valid_lens", "masked", "keep", "sdpa", "additive", "none")
LENS_NAMES = ("valid_lens", "valid_len", "valid_length", "valid_lengths", "lens", "lengths",
               "seq_lens", "key_lens")
# Names that say which input is the query, the key and the value.
QKV_NAMES = (("query", "key", "value"), ("q", "k", "v"), ("queries", "keys", "values"),
             ("query_states", "key_states", "value_states"), ("xq", "xk", "xv"))
# Names of a mask whose polarity is fixed: True = ignore this key (PyTorch's key_padding_mask).
PADDING_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask", "pad_mask")
# Parameters that are not a mask (a flag, a scale, a dropout), and what a required one gets.
SCALE_NAMES = ("scale", "scaling", "softmax_scale", "sm_scale", "scale_factor", "temperature")
FLAG_WORDS = ("drop", "train", "scale", "scaling", "retain", "return", "need", "causal",
              "average", "temperature", "window", "deterministic", "verbose", "eps", "bias",
              "head", "dim", "cache", "past", "position", "output", "use_")


@dataclass
class Call:
    """How a function (or a module's ``forward``) is called, read off its signature.

    Attributes:
        input_names: pass the inputs by these names (``("query", "key", "value")``), or
            None to pass them by position, first.
        mask_name: the mask parameter, or None when there is none (or it cannot be read).
        mask_keyword: pass the mask by name (it does not come right after the inputs).
        mask_default: the mask may be left out.
        guessed: the convention its name says (``valid_lens``, ``masked`` for a key padding
            mask, ``sdpa``), ``none`` when there is no mask, None when behaviour must say.
        fixed: required parameters that are not inputs nor the mask, and what they get:
            ``"scale"`` (1/sqrt(Dk)), ``"zero"`` (a dropout), ``"false"``/``"true"`` (a
            flag) or ``"module"`` (a stand-in for the calling layer: ``training=False``,
            ``num_key_value_groups=1``, as transformers' attention functions read it).
        unfilled: required parameters the check cannot fill (the call will fail).
        flags: the parameters after the inputs that were read as flags, not masks.
    """

    input_names: tuple[str, ...] | None = None
    mask_name: str | None = None
    mask_keyword: bool = False
    mask_default: bool = True
    guessed: str | None = "none"
    fixed: dict[str, str] = field(default_factory=dict)
    unfilled: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def _is_flag(p: inspect.Parameter) -> bool:
    """A parameter that is not a mask: a bool/number/str default, or a flag's name."""
    default = p.default
    if default is not inspect.Parameter.empty and default is not None:
        return True  # True, 0.1, "mean"...: a flag or a knob, never a mask
    name = p.name.lower()
    return "mask" not in name and any(w in name for w in FLAG_WORDS)


def _fill(p: inspect.Parameter) -> str | None:
    """What a required non-mask parameter gets, or None when the check cannot tell."""
    name = p.name.lower()
    if name in SCALE_NAMES:
        return "scale"
    if "drop" in name:
        return "zero"
    if name == "module":  # the calling layer, as transformers' attention functions take it
        return "module"
    if name in ("training", "is_training", "train", "deterministic"):
        return "true" if name == "deterministic" else "false"
    return None


def read_call(fn: Any, n_inputs: int) -> Call:
    """How to call ``fn`` with ``n_inputs`` inputs (3: q, k, v; 1: x) and a mask.

    Args:
        fn: a function, a bound method, or an object whose ``forward`` (an ``nn.Module``)
            or ``__call__`` says what it takes.
        n_inputs: 3 for attention, 1 for a softmax or a self-attention module.

    Returns:
        A :class:`Call`; an unreadable signature gives positional inputs and an optional
        mask whose convention behaviour must say.
    """
    if not inspect.isroutine(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # an nn.Module: its forward says what it takes
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return Call(guessed=None)
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    by_name = {p.name: p for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    call = Call()
    inputs = positional[:n_inputs]
    if n_inputs == 3:
        for names in QKV_NAMES:
            found = [next((p for p in params if p.name.lower() == n), None) for n in names]
            if all(p is not None and p.kind != p.POSITIONAL_ONLY for p in found):
                if [p.name for p in positional[:3]] != [p.name for p in found]:
                    call.input_names = tuple(p.name for p in found)  # type: ignore[union-attr]
                inputs = found  # type: ignore[assignment]
                break
    if n_inputs == 1 and not positional:  # forward(self, *, x, mask=None): x by name
        keyword = [p for p in params if p.kind == p.KEYWORD_ONLY and "mask" not in p.name.lower()
                   and p.default is inspect.Parameter.empty]
        if keyword:
            call.input_names, inputs = (keyword[0].name,), keyword[:1]
    if len(inputs) < n_inputs and call.input_names is None:
        return call  # fewer named parameters than inputs (*args): inputs by position only
    used = {p.name for p in inputs}
    rest = [p for p in params if p.name not in used]
    if n_inputs == 3 and "attn_mask" in by_name and "is_causal" in by_name:
        call.mask_name, call.guessed, call.mask_keyword = "attn_mask", "sdpa", True
        return call
    mask = next((p for p in rest if p.name.lower() in LENS_NAMES), None)
    guess: str | None = "valid_lens" if mask is not None else None
    if mask is None:
        mask = next((p for p in rest if p.name.lower() in ("mask", "attn_mask",
                                                           "attention_mask")), None)
    if mask is None:
        mask = next((p for p in rest if p.name.lower() in PADDING_NAMES), None)
        guess = "masked" if mask is not None else None
    if mask is None:
        mask = next((p for p in rest if "mask" in p.name.lower()), None)
    if mask is None:  # an unnamed parameter right after the inputs, if it is no flag
        after = [p for p in positional if p.name not in used]
        if after and positional.index(after[0]) == n_inputs and not _is_flag(after[0]):
            mask = after[0]
    for p in rest:
        if p is mask:
            continue
        if p.default is inspect.Parameter.empty and p.kind != p.VAR_POSITIONAL:
            how = _fill(p)
            if how is None:
                call.unfilled.append(p.name)
            else:
                call.fixed[p.name] = how
        elif p in positional and positional.index(p) >= n_inputs:
            call.flags.append(p.name)
    if mask is None:
        return call
    call.mask_name, call.guessed = mask.name, guess
    call.mask_default = mask.default is not inspect.Parameter.empty
    in_place = mask in positional and positional.index(mask) == n_inputs
    call.mask_keyword = (call.input_names is not None or not in_place) \
        and mask.kind != mask.POSITIONAL_ONLY
    return call


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
    """``(name, has_default, convention guessed from the names)`` of the mask parameter
    (see :func:`read_call`); name None when there is none or the signature is unreadable."""
    call = read_call(fn, n_inputs)
    return call.mask_name, call.mask_default, call.guessed


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
