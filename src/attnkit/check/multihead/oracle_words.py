"""The sentences of the multi-head oracle: templates with named fields in the catalogue
(:mod:`attnkit.check.catalogue.en.oracle`, :mod:`attnkit.check.catalogue.zh.oracle`).
:func:`say` makes one, a :class:`~attnkit.check.catalogue.Text`: English as a ``str``, any
language when rendered."""

from __future__ import annotations

from typing import Any

from ..catalogue import T, Text

__all__ = ["say"]


def say(key: str, **fields: Any) -> Text:
    """The oracle's sentence ``key`` with ``fields``."""
    return T(key, **fields)
