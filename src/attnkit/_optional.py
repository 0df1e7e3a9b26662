"""Optional dependencies: one check that names the pip extra to install.

``attnkit`` itself needs NumPy only; PyTorch, Triton and matplotlib come with extras
(``attnkit[torch]``, ``attnkit[triton]``, ``attnkit[viz]``). Without one, the subpackage that
needs it raises an :class:`ImportError` that says what to install, instead of a bare
``ModuleNotFoundError: No module named 'torch'`` from deep inside the package.

A subpackage that needs its extra to be imported at all starts with::

    try:
        import torch as _torch  # noqa: F401
    except ModuleNotFoundError as _err:
        from .._optional import raise_missing

        raise_missing(_err, "torch", extra="torch", user="attnkit.torch")

(a ``try`` block, so the imports after it still count as top-of-file imports).
"""

from __future__ import annotations

import importlib
from typing import NoReturn

__all__ = ["raise_missing", "require"]


def raise_missing(err: ModuleNotFoundError, module: str, *, extra: str, user: str) -> NoReturn:
    """Re-raise a failed import of an optional dependency as an ImportError that names
    the extra installing it.

    Args:
        err: the ``ModuleNotFoundError`` of the import.
        module: the top-level module that was imported, e.g. ``"torch"``.
        extra: the attnkit extra that installs the module, e.g. ``"torch"``.
        user: what needs it, for the message, e.g. ``"attnkit.torch"``.

    Raises:
        ImportError: ``user needs torch, which is not installed: pip install
            'attnkit[torch]'``, with ``.name`` the module (as on ``err``). When
            ``err`` is about another module (``module`` is installed but something it
            imports is missing), ``err`` itself is re-raised: the extra would not fix it.
    """
    if err.name != module:
        raise err
    raise ImportError(
        f"{user} needs {module}, which is not installed: pip install 'attnkit[{extra}]'",
        name=module,
    ) from err


def require(module: str, *, extra: str, user: str) -> None:
    """Import ``module`` or raise an ImportError naming the extra that installs it
    (see :func:`raise_missing`)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise_missing(err, module, extra=extra, user=user)
