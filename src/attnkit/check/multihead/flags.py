"""A module's own causal switch: ``forward(..., causal=False)`` or ``is_causal=False``.

A module declared causal (``--causal``) whose ``forward`` takes such a flag is causal only
when the flag is set, so the check sets it in every call (and every reproducer), as the
function check passes ``is_causal=True`` to an SDPA-like function. A module that takes the
flag and ignores it still lets early positions see later ones: ``causal-leak``.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..meet.build import CAUSAL_FLAGS

__all__ = ["CAUSAL_FLAGS", "causal_flag"]


def causal_flag(m: Any) -> str | None:
    """The name of ``m``'s boolean causal flag, or None.

    Args:
        m: a module (its ``forward`` is read) or a callable.

    Returns:
        The parameter named ``causal`` or ``is_causal`` (any case) that has a boolean
        default or a ``bool`` annotation, or None when ``forward`` takes none.
    """
    fn = m.forward if callable(getattr(m, "forward", None)) else m
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    for p in params:
        if p.name.lower() not in CAUSAL_FLAGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = p.annotation if isinstance(p.annotation, str) \
            else getattr(p.annotation, "__name__", str(p.annotation))
        if isinstance(p.default, bool) or "bool" in annotation:
            return p.name
    return None
