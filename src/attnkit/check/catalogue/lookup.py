"""The templates of one language, looked up by key or by code (the language files are
modules of this package, loaded on first use)."""

from __future__ import annotations

import importlib
from typing import Any

from .codes import CATALOGUE
from .lang import check_language

__all__ = ["code_words", "style", "words"]


def _module(lang: str) -> Any:
    return importlib.import_module(f"{__package__}.{check_language(lang)}")


def words(lang: str) -> dict[str, str]:
    """Every template of ``lang`` by key (report frame, sentences of the checks)."""
    return _module(lang).TEXTS


def code_words(code: str, lang: str) -> dict[str, str]:
    """What ``lang`` says about ``code``: ``title``, ``what`` (is wrong), ``why`` (it
    matters) and ``fix``."""
    if code not in CATALOGUE:
        raise KeyError(f"unknown finding code {code!r}")
    return _module(lang).CODES[code]


def style(lang: str) -> str:
    """How ``lang`` lays a text report out: ``"table"`` (a row per finding) or ``"blocks"``
    (a block per finding, for scripts whose characters take two columns)."""
    return _module(lang).STYLE
