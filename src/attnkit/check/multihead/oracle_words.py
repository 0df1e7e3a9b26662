"""The sentences of the multi-head oracle: templates with named fields in the catalogue
(:mod:`attnkit.check.catalogue.en.oracle`, :mod:`attnkit.check.catalogue.zh.oracle`).
:func:`say` makes one, a :class:`~attnkit.check.catalogue.Text`: English as a ``str``, any
language when rendered."""

from __future__ import annotations

from typing import Any

from ..catalogue import T, Text

__all__ = ["say"]

# Sentences that count: the field counted, and the key (ending "-1") that says one of it.
_COUNTED = {"oracle.heads": "H", "oracle.heads-kv": "Hkv"}


def say(key: str, **fields: Any) -> Text:
    """The oracle's sentence ``key`` with ``fields`` (its singular form where the field it
    counts is 1: "1 key/value head")."""
    if key in _COUNTED and fields.get(_COUNTED[key]) == 1:
        key += "-1"
    return T(key, **fields)
