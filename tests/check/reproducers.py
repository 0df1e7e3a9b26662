"""Running a printed reproducer as a user would: from the repository's root (reproducers
name the files they load relative to the working folder), with the warnings of code that
overflows on purpose silenced; and what a reader reads in one as words (its comments and
strings: :func:`reproducer_prose`). Shared by the check tests (the ``at_root`` fixture and
the Chinese reading of every report: conftest.py)."""

from __future__ import annotations

import io
import os
import re
import tokenize
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def raises_as_printed(code: str, **names: object) -> BaseException | None:
    """What running ``code`` from the root raises (None: it ran clean); ``names`` are
    defined for it beforehand (a reproducer whose ``fn = ...`` line is left to the user)."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            exec(compile(code, "<reproducer>", "exec"), {"__name__": "__reproducer__", **names})
    except BaseException as err:  # the point: it must raise
        return err
    finally:
        os.chdir(here)
    return None


_STRING = re.compile(r"^([A-Za-z]*)(\"\"\"|'''|\"|')(.*)\2$", re.S)


def reproducer_prose(code: str) -> list[str]:
    """What a reader reads in a reproducer as words, not code: its comments and the text
    of its string literals (what it prints, an assertion's message, a docstring; an
    f-string's ``{...}`` left out)."""
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):  # not Python: every comment, roughly
        return [line.split("# ", 1)[1] for line in code.splitlines() if "# " in line]
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            found.append(tok.string.lstrip("#").strip())
        elif tok.type == tokenize.STRING and (m := _STRING.match(tok.string)):
            text = m.group(3)
            found.append(re.sub(r"\{[^{}]*\}", " ", text) if "f" in m.group(1).lower()
                         else text)
    return [text for text in found if text]
