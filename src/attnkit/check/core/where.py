"""Where the checked code raised: the line of the user's own source that failed, for
findings that quote an exception (an ``assert`` with no message says nothing by itself).
"""

from __future__ import annotations

import os
import traceback

from ..catalogue import T, Text

__all__ = ["failing_line"]

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attnkit/check


def failing_line(err: BaseException) -> Text | str:
    """The innermost line of the user's code in ``err``'s traceback, as
    ``"line 12: assert mask.dim() == 2"``; ``""`` when none is the user's (the checker's
    own frames, PyTorch's and NumPy's are skipped)."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = os.path.abspath(frame.filename)
        if path.startswith(_OURS) or f"{os.sep}torch{os.sep}" in path \
                or f"{os.sep}numpy{os.sep}" in path or frame.filename.startswith("<"):
            continue
        return T("where.line", n=frame.lineno, code=(frame.line or "").strip())
    return ""
