"""Which language a report is printed in when none is named."""

from __future__ import annotations

import os

__all__ = ["LANGUAGES", "check_language", "get_language", "set_language"]

LANGUAGES = ("en", "zh")

_language: str | None = None


def check_language(lang: str) -> str:
    """Return ``lang`` if a report can be written in it, else raise ``ValueError``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return lang


def set_language(lang: str | None) -> None:
    """Write reports in ``lang`` (``"en"`` or ``"zh"``) from now on, when they are printed
    without naming a language (``print(report)``); None goes back to the default."""
    global _language
    _language = None if lang is None else check_language(lang)


def get_language() -> str:
    """The language of ``print(report)``: the one :func:`set_language` chose, else the
    environment variable ``ATTNKIT_LANG`` (the Chinese notebooks set it to ``zh``), else
    English."""
    if _language is not None:
        return _language
    env = os.environ.get("ATTNKIT_LANG", "").strip().lower()
    return env if env in LANGUAGES else "en"
