"""Loading a target: a function, class, instance or bound method from a file, a module or a
Jupyter notebook, as ``"path/to/file.py:name"``, ``"notes.ipynb:name"`` or
``"package.module:name"``; and the spec that finds an object again, so that a reproducer
loads exactly what the checker was given.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from ..catalogue import T, first_line

__all__ = ["TargetLoadError", "load_target", "notebook_cells", "origin_of", "stdout_to_stderr",
           "target_spec"]


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
        raise ValueError(T("target.spec", spec=repr(spec)))
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
            raise TargetLoadError(T("load.import", where=where, error=(
                f"{type(err).__name__}: {first_line(err, 200)}"))) from err
        except Exception as err:
            raise TargetLoadError(T("load.import", where=where, error=(
                f"{type(err).__name__}: {first_line(err, 200)}"))) from err
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(T("target.no-attribute", spec=spec, where=where,
                               name=repr(part)))
        obj = getattr(obj, part)
    _LOADED[id(obj)] = (obj, found_again, origin)
    return obj


def _import_file(where: str) -> Any:
    path = os.path.abspath(where)
    if not os.path.isfile(path):
        raise ValueError(T("target.no-file", where=where))
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    module_name = f"_attnkit_check_{stem}_{abs(hash(path)) % 10**8}"
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(T("target.not-python", where=where))
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:
            del sys.modules[module_name]
            raise TargetLoadError(T("load.import", where=where, error=(
                f"{type(err).__name__}: {first_line(err, 200)}"))) from err
    return module


def notebook_cells(path: str) -> list[tuple[int, str]]:
    """``(cell number, source)`` of a notebook's code cells, numbered from 1 over all its
    cells (markdown included, as they appear), magics and shell lines left out."""
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(T("target.not-notebook", path=path,
                           error=f"{type(err).__name__}: {first_line(err, 200)}")) from err
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
        raise ValueError(T("target.no-file", where=where))
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
            raise TargetLoadError(T("load.cell", number=number, file=base, name=repr(name),
                                    type=type(err).__name__, line=first_line(err, 200))
                                  ) from err
        if name in module.__dict__:
            origin = T("origin.cell", number=number, file=base)
            module.__attnkit_origin__ = origin
            return module, origin
    del sys.modules[module_name]
    raise ValueError(T("target.no-cell", where=where, name=repr(name)))


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


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what is printed to stdout to stderr instead: Python's ``print`` and, where the
    process has real file descriptors, writes to fd 1 from C code or child processes."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
