"""The command line of ``attnkit check`` in the report's language: its help, argparse's own
words (``usage:``, the section titles, ``-h``) and its one-line usage errors.

Help is printed while the arguments are parsed, before ``--lang`` is read, so the language
of a command line is read off the line itself (``--lang zh`` or ``--lang=zh``), else
``ATTNKIT_LANG``, else English (:func:`command_language`). English is argparse's own text,
unchanged; another language rewrites argparse's messages that a usage error can hold.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from .lang import LANGUAGES, get_language
from .text import T, render

# LANGUAGES: what --lang may name (one folder of templates each, see the package).
__all__ = ["LANGUAGES", "command_language", "error_line", "help_words", "localize"]


def command_language(argv: Sequence[str]) -> str:
    """The language of a command line's help and errors: its ``--lang``, else
    :func:`get_language` (``ATTNKIT_LANG``, else ``"en"``)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--lang" and i + 1 < len(argv) else \
            arg.partition("=")[2] if arg.startswith("--lang=") else None
        if value in LANGUAGES:
            return value
    return get_language()


def help_words(lang: str) -> Any:
    """``h(key, **fields)``: the help sentence ``key`` of the catalogue in ``lang``."""
    return lambda key, **fields: render(T(key, **fields), lang)


_WIDE = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")
_NO_LINE_START = set("，。、；：）》」』！？")


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns, a wide (CJK) character two columns:
    a line breaks between wide characters or at a space, never inside a code word such as
    ``additive``, and no line starts with closing punctuation (argparse's textwrap counts
    characters and breaks only at spaces)."""
    lines: list[str] = []
    line, used = "", 0
    for token in re.findall(r"\s+|" + _WIDE.pattern + r"|[^\s\u2e80-\u9fff\uf900-\ufaff"
                            r"\uff00-\uffef\u3000-\u303f]+", text):
        if token.isspace():
            if line:
                line, used = line + " ", used + 1
            continue
        cols = sum(2 if _WIDE.match(c) else 1 for c in token)
        if line.strip() and used + cols > width and token not in _NO_LINE_START:
            lines.append(line.rstrip())
            line, used = "", 0
        line, used = line + token, used + cols
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _formatter(usage_prefix: str) -> type[argparse.HelpFormatter]:
    """argparse's help formatter with ``usage_prefix`` in place of ``"usage: "``, and text
    wrapped by columns (:func:`_wrap`)."""

    class Formatter(argparse.HelpFormatter):
        def add_usage(self, usage: Any, actions: Any, groups: Any,
                      prefix: str | None = None) -> None:
            super().add_usage(usage, actions, groups,
                              usage_prefix if prefix is None else prefix)

        def _split_lines(self, text: str, width: int) -> list[str]:
            return _wrap(" ".join(text.split()), width)

        def _fill_text(self, text: str, width: int, indent: str) -> str:
            return "\n".join(indent + line for line in _wrap(" ".join(text.split()),
                                                               width - len(indent)))

    return Formatter


def localize(parser: argparse.ArgumentParser, lang: str) -> argparse.ArgumentParser:
    """Write ``parser``'s own words (``usage:``, section titles, ``-h``'s help) in
    ``lang``, and remember ``lang`` for its errors (``parser.lang``); returns ``parser``."""
    parser.lang = lang  # type: ignore[attr-defined]
    if lang == "en":
        return parser
    parser.formatter_class = _formatter(render(T("cli.usage"), lang))
    parser._positionals.title = render(T("cli.positionals"), lang)
    parser._optionals.title = render(T("cli.options"), lang)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.help = render(T("cli.help"), lang)
    return parser


# argparse's messages (Python 3.9-3.13) that an error line can hold, and their sentences.
_ARGPARSE = (
    (r"the following arguments are required: (?P<names>.+)", "cli.required"),
    (r"argument (?P<name>\S+): invalid choice: (?P<value>.+?) \(choose from (?P<choices>.+)\)",
     "cli.invalid-choice"),
    (r"unrecognized arguments: (?P<args>.+)", "cli.unrecognized"),
    (r"argument (?P<name>\S+): expected one argument", "cli.expected-one"),
    (r"argument (?P<name>\S+): expected an integer >= (?P<low>\d+), got (?P<value>.+)",
     "cli.expected-int"),
    (r"argument (?P<name>\S+): expected a positive integer, got (?P<value>.+)",
     "cli.expected-int"),
    (r"argument (?P<name>\S+): expected a positive number, got (?P<value>.+)",
     "cli.expected-number"),
    (r"argument (?P<name>\S+): (?P<message>.+)", "cli.argument"),
)


def _message(message: str) -> Any:
    """argparse's ``message`` as a catalogue sentence (as written when none matches)."""
    for pattern, key in _ARGPARSE:
        m = re.fullmatch(pattern, message)
        if m:
            fields = m.groupdict()
            if key == "cli.expected-int" and "low" not in fields:
                fields["low"] = "1"
            return T(key, **fields)
    return message


def error_line(prog: str, message: Any, lang: str) -> str:
    """The one line of a usage error of ``prog`` in ``lang`` (a catalogue sentence, or
    argparse's own message), pointing at ``prog --help``."""
    if lang != "en" and not hasattr(message, "key"):
        message = _message(str(message))
    return render(T("cli.error", prog=prog, message=render(message, lang)), lang) + "\n"
