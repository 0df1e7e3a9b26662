"""English: the words of every code and every sentence of a report (templates with named
fields, ``str.format``), one folder per language: the same keys as every other (tested)."""

from __future__ import annotations

from .anymodel import TEXTS as _ANYMODEL
from .behaviour import TEXTS as _BEHAVIOUR
from .block import TEXTS as _BLOCK
from .checks import TEXTS as _CHECKS
from .cli import TEXTS as _CLI
from .codes import CODES
from .model import TEXTS as _MODEL
from .multihead import TEXTS as _MULTIHEAD
from .oracle import TEXTS as _ORACLE
from .repro import TEXTS as _REPRO

__all__ = ["CODES", "STYLE", "TEXTS"]

STYLE = "table"

TEXTS: dict[str, str] = {**_CHECKS, **_BEHAVIOUR, **_MULTIHEAD, **_ORACLE, **_BLOCK, **_MODEL,
                          **_ANYMODEL, **_REPRO, **_CLI}
