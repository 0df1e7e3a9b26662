"""The words of the checker, once: every finding code (:mod:`.codes`: its severity in each
kind of check) and every sentence of a report as a template with named fields, one file
per language (:mod:`.en`, :mod:`.zh`), from which the text and JSON reports
(:mod:`attnkit.check.render`), the reference pages of the codes and the tests are made.

Adding a language is one folder like :mod:`.en` (the same keys, a ``STYLE``) and its name in
:data:`LANGUAGES`. Chinese follows the terms of the Chinese edition of d2l (zh.d2l.ai):
查询、键、值, 注意力汇聚, 掩蔽softmax, 有效长度, 缩放点积注意力, 多头注意力, 暂退法.
"""

from __future__ import annotations

from .codes import CATALOGUE, ERROR, KINDS, WARNING, Code, severity
from .lang import LANGUAGES, check_language, get_language, set_language
from .lookup import code_words, style, words
from .text import T, Text, UsageError, first_line, join, note, quoted, render, said

__all__ = ["CATALOGUE", "ERROR", "KINDS", "LANGUAGES", "WARNING", "Code", "T", "Text",
           "UsageError",
           "check_language", "code_words", "doc_link", "first_line", "get_language", "join",
           "note", "quoted", "render", "said",
           "set_language", "severity", "style", "words"]


def doc_link(code: str) -> str:
    """Where the reference page of ``code`` is."""
    return f"docs/check-codes.md#{code}"
