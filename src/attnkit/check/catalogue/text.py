"""A sentence of a report as a template id with named fields, rendered in any language.

The checks never write a finished sentence: they write ``T("judge.not-scaled", ...)``, a
:class:`Text` whose template lives once per language (:mod:`.en`, :mod:`.zh`). A
:class:`Text` is also a ``str`` (its English rendering), so code that compares or prints
findings keeps working; ``render(x, "zh")`` writes it in Chinese. A field may be a number,
an identifier or a quoted error (written as it is in every language), another
:class:`Text`, or a list of them (joined in the language's way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .lang import get_language
from .lookup import words

__all__ = ["T", "Text", "UsageError", "first_line", "join", "note", "quoted", "render",
           "said"]


class Text(str):
    """A template id and its fields; as a ``str``, its English rendering.

    ``Text + str`` and ``str + Text`` give a :class:`Text` (the parts rendered one after
    the other), so a sentence built in pieces still renders in every language.
    """

    key: str
    fields: dict[str, Any]

    def __new__(cls, key: str, fields: dict[str, Any] | None = None) -> Text:
        fields = dict(fields or {})
        obj = super().__new__(cls, render_key(key, fields, "en"))
        obj.key, obj.fields = key, fields
        return obj

    def render(self, lang: str, literal: Callable[[str], str] | None = None) -> str:
        """This sentence in ``lang``; ``literal`` (tests) rewrites each field written as is."""
        return render_key(self.key, self.fields, lang, literal)

    def __add__(self, other: object) -> Text:  # type: ignore[override]
        if not isinstance(other, str):
            return NotImplemented
        return Text("+", {"parts": [self, other]})

    def __radd__(self, other: object) -> Text:
        if not isinstance(other, str):
            return NotImplemented
        return Text("+", {"parts": [other, self]})

    def __reduce__(self) -> tuple:  # copy, deepcopy and dataclasses.asdict keep the template
        return (Text, (self.key, self.fields))


class UsageError(ValueError):
    """An argument of a check that does not fit the code checked (a convention it cannot
    take): a :class:`ValueError` whose message is a catalogue sentence (``args[0]``, a
    :class:`Text`), printed in the current language (:func:`get_language`); the command
    line renders ``args[0]`` in the report's language."""

    def __str__(self) -> str:
        return render(self.args[0], get_language()) if self.args else ""


def first_line(err: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message, at most ``limit`` characters (``""`` when
    it has none): what a sentence quotes, as written, of an error the checked code raised."""
    return (str(err).strip().splitlines() or [""])[0][:limit]


def T(key: str, /, **fields: Any) -> Text:
    """The sentence ``key`` of the catalogue with ``fields``."""
    return Text(key, fields)


def join(items: Iterable[Any], sep: str = "clauses") -> Text:
    """``items`` one after the other, separated in the language's way: ``"clauses"`` (``; ``
    in English, ``；`` in Chinese) or ``"list"`` (``, `` / ``、``)."""
    return Text("join", {"items": list(items), "sep": sep})


def _field(value: Any, lang: str, literal: Callable[[str], str] | None) -> Any:
    if isinstance(value, Text):
        return value.render(lang, literal)
    if isinstance(value, list):
        return words(lang)["sep.list"].join(str(_field(v, lang, literal)) for v in value)
    if literal is not None and isinstance(value, str):
        return literal(value)
    return value


def render_key(key: str, fields: dict[str, Any], lang: str,
               literal: Callable[[str], str] | None = None) -> str:
    """The template ``key`` of ``lang`` filled with ``fields`` (English when ``lang`` lacks
    it: a report is always printed; tests check that every language has every key)."""
    if key == "+":
        return "".join(render(p, lang, literal) for p in fields["parts"])
    if key == "join":
        sep = words(lang)["sep." + fields["sep"]]
        return sep.join(render(p, lang, literal) for p in fields["items"])
    template = words(lang).get(key)
    if template is None:
        template = words("en")[key]
    return template.format(**{k: _field(v, lang, literal) for k, v in fields.items()})


def render(value: Any, lang: str, literal: Callable[[str], str] | None = None) -> str:
    """``value`` in ``lang``: a :class:`Text` from its template, anything else as written."""
    if isinstance(value, Text):
        return value.render(lang, literal)
    return "" if value is None else str(value)


# -- a reproducer's words: its code as written, its comments and messages in any language
def note(code: str, key: str, **fields: Any) -> Text:
    """The line ``code`` with the comment ``key`` of the catalogue after it."""
    return code + "  # " + T(key, **fields)


def quoted(text: Any) -> Text:
    """``text`` (a sentence, or a finding's message) as a string literal of the reproducer."""
    return T("repro.quoted", text=text)


def said(key: str, **fields: Any) -> Text:
    """The sentence ``key`` as a string literal (what a line prints, an assertion's message)."""
    return quoted(T(key, **fields))
