"""Running a printed reproducer as a user would: from the repository's root (reproducers
name the files they load relative to the working folder), with the warnings of code that
overflows on purpose silenced. Shared by the check tests (the ``at_root`` fixture: conftest.py)."""

from __future__ import annotations

import os
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
