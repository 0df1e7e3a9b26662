"""The words of the checker, once: every finding code (:mod:`.codes`: its severity in each
kind of check) and every sentence of a report as a template with named fields, one file
per language (:mod:`.en`, :mod:`.zh`), from which the text and JSON reports
(:mod:`attnkit.check.render`), the reference pages of the codes and the tests are made.

Adding a language is one folder like :mod:`.en` (the same keys, a ``STYLE``) and its name in
:data:`LANGUAGES`. Chinese follows the terms of the Chinese edition of d2l (zh.d2l.ai):
查询、键、值, 注意力汇聚, 掩蔽softmax, 有效长度, 缩放点积注意力, 多头注意力, 暂退法.
"""

from __future__ import annotations

import importlib
from typing import Any

from .codes import CATALOGUE, ERROR, KINDS, WARNING, Code, severity
from .lang import LANGUAGES, check_language, get_language, set_language
from .text import T, Text, first_line, join, render

__all__ = ["CATALOGUE", "ERROR", "KINDS", "LANGUAGES", "WARNING", "Code", "T", "Text",
           "check_language", "code_words", "doc_link", "first_line", "get_language", "join",
           "render",
           "set_language", "severity", "words"]


def _module(lang: str) -> Any:
    return importlib.import_module(f"{__name__}.{check_language(lang)}")


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


def doc_link(code: str) -> str:
    """Where the reference page of ``code`` is."""
    return f"docs/check-codes.md#{code}"
